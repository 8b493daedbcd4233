"""The delivery loop: moves what the spool holds to the platform, one run at a
time, on one thread per process (a member of a Kafka fleet advances a few
runs at once: each of its platform calls waits for a Kafka commit first, and
calls waiting together share one).

Each pass takes every run that still has something to deliver or to close
and advances it as far as it goes now: a run whose producers died is ended as
crashed (``crashed.py``), a local run is closed in the spool, and an online
run goes through its lifecycle (create or attach → stream → update → close)
in ``eval_run.py`` or ``training_run.py``. A run that fails is paused alone
(``backoff.py``) and the pass goes on with the next one, so one run never
holds up the others. The spool's lease (``lease.py``) lets one process at a
time deliver a spool.

Everything the uploader knows lives in the spool, so a process that dies at
any point is replaced by the next one that opens the spool with no loss and
no duplicate: it re-sends the persisted bytes of an open Prime Traces upload
(the service replays the receipt), counts a legacy sample request that may
have acted as *uncertain* instead of appending its rows twice, and finds a
run whose create answer was lost through the list endpoint.

Failures that may succeed later (an outage, 429, 503) pause the run with
backoff, honouring Retry-After, for as long as it takes: a run is never given
up because the platform was away. Only a permanent refusal (an environment
that does not exist, a credential without access, a wrong address) stops a
run's delivery, with its episodes kept, and that is recorded on the run for
``prime-runs-otel show`` and ``push`` (``refusals.py`` says which answer
costs what).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from .._courtesy import ExportRunning, PacedGiveWay, stand_back
from .._text import shown
from .._untraced import untraced
from ..config import Settings
from .backoff import Backoff, Pauses
from .clients import PlatformClients
from .crashed import end_if_crashed
from .eval_run import EvalLifecycle
from .kafka.owner import FLEET_DELIVERY_WORKERS, RunOwner
from .lease import Lease
from .lifecycle import STRAGGLER_WAIT, RunLeftSpool, RunLifecycle, StragglerWait, reload
from .lines import LineCache
from .platform.http import PlatformError
from .platform.watch import WATCH
from .refusals import StopDelivery, stop_run
from .spool import RunRow, Spool
from .spool.folds import FOLD_BEHIND
from .stream import EpisodeStream
from .training_run import TrainingLifecycle

logger = logging.getLogger(__name__)

#: New episodes of a run between two looks at how far behind its fold is.
FOLD_LOOK_EVERY = 1000


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
        straggler_wait: float = STRAGGLER_WAIT,
        owner: RunOwner | None = None,
        behind_collector: bool = False,
    ) -> None:
        """``export_running`` is the flag of the exporter in this process: the
        uploader lets go of the GIL between episodes while it is up. Without
        one (``serve``, whose intake threads commit at any moment) it does
        so at most once a millisecond (:class:`.._courtesy.PacedGiveWay`).
        ``straggler_wait``: how long an ended run that still misses episodes
        waits for them without news (see :class:`.lifecycle.StragglerWait`).
        ``owner``: in a Kafka fleet, which runs this member delivers now and
        the record of its intents (see :mod:`.kafka.owner`); without one
        every run of the spool is this process's.
        ``behind_collector``: episodes arrive through a collector, whose
        retries bring duplicates that are not episodes recorded twice."""
        self._spool = spool
        self._poll_interval = poll_interval
        self._idle_timeout = idle_timeout
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease = Lease(spool, lease_ttl)
        self._pauses = Pauses(settings.retry_max_delay)
        self._clients = PlatformClients(settings)
        self._owner = owner
        self._said_disk = False
        self._base_url = settings.base_url
        #: The runs being advanced now (what a silent platform holds up).
        self._current: list[str] = []
        self._current_lock = threading.Lock()
        #: Runs advanced at once in a pass: a fleet member's platform calls
        #: each wait for a Kafka commit, which calls of several runs share.
        self._workers = FLEET_DELIVERY_WORKERS if owner is not None else 1
        self._pool: ThreadPoolExecutor | None = None
        #: Runs whose ``last_error`` says the platform did not answer, or
        #: why their delivery paused: cleared once they get through.
        self._noted: set[str] = set()
        #: Prime Traces lines the exporter in this process got built with
        #: the episodes it stored, so they need not be parsed again here.
        self.lines = LineCache()
        #: Each run's count of episodes when its fold was last looked at
        #: (``_fold_behind``): a pass looks again only after a few more.
        self._fold_looked: dict[str, int] = {}
        self._give_way = export_running.give_way if export_running else PacedGiveWay()
        self._stream = self._episode_stream(settings)
        self._evals, self._training = self._lifecycles(settings, straggler_wait, behind_collector)

    def _episode_stream(self, settings: Settings) -> EpisodeStream:
        """The runs' episodes on their way out, giving way to ``export()``
        (see ``__init__``)."""
        return EpisodeStream(
            self._spool,
            settings,
            self._clients,
            self._lease,
            self.lines,
            give_way=self._give_way,
            stopping=self._stopping,
            more_pending=self._wake.set,
        )

    def _lifecycles(
        self, settings: Settings, straggler_wait: float, behind_collector: bool
    ) -> tuple[EvalLifecycle, TrainingLifecycle]:
        """An eval run's lifecycle and a training run's, over the one stream."""
        stragglers = StragglerWait(straggler_wait, behind_collector=behind_collector)
        common = (self._spool, self._clients, self._stream)
        return (
            EvalLifecycle(*common, team_id=settings.team_id, stragglers=stragglers),
            TrainingLifecycle(*common, team_id=settings.team_id, stragglers=stragglers),
        )

    # -- thread control ------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        if not self._said_disk:
            # Said by the process that writes the spool and delivers it, once:
            # a small disk refuses episodes early, and nothing else says why.
            self._said_disk = True
            note = self._spool.housekeeping.small_disk_note()
            if note is not None:
                logger.warning("%s", note)
        self._stopping.clear()
        WATCH.add(self)
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
        WATCH.remove(self)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        self._lease.release()
        self._clients.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        if self._owner is not None:
            stand_back()  # a fleet member's requests go first (see .._courtesy)
        # The uploader's thread makes only the package's own calls (platform
        # HTTP, the spool's SQLite): none of it is traced, for its whole life.
        with untraced():
            self._deliver_until_stopped()

    def _deliver_until_stopped(self) -> None:
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
        """Advance every deliverable run as far as it goes now (untraced, on
        whichever thread calls it: ``push`` calls it on its main thread)."""
        with untraced():
            if not self._lease.acquire():
                return
            try:
                # Delivery needs room on the disk to free room on it (size.py).
                self._spool.housekeeping.keep_room()
                self._deliver_runs(only)
            finally:
                # Here rather than in whichever commit crosses SQLite's threshold,
                # which would often be an export() the SDK is waiting on; at
                # most once a second, as the next pass waits for it.
                self._spool.checkpoint(paced=True)

    def _deliver_runs(self, only: Sequence[str] | None) -> None:
        runs = [
            run
            for run in self._spool.delivery.runs_to_deliver_or_close()
            if only is None or run.local_id in only
        ]
        if self._workers > 1 and len(runs) > 1:
            self._deliver_in_parallel(runs, only)
            return
        for run in runs:
            if self._stopping.is_set() and only is None:
                return
            self._deliver_run(run)

    def _deliver_in_parallel(self, runs: list[RunRow], only: Sequence[str] | None) -> None:
        """Several runs advanced at once (a fleet member): each of their
        platform calls waits for a Kafka commit first (:mod:`.kafka.owner`),
        and calls of different runs waiting together share one commit and
        then go out side by side. A run is on one thread at a time: the pass
        ends when every run's turn has."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="uploader-run")

        def turn(run: RunRow) -> None:
            if self._stopping.is_set() and only is None:
                return
            with untraced():
                self._deliver_run(run)

        for done in [self._pool.submit(turn, run) for run in runs]:
            done.result()

    def _deliver_run(self, run: RunRow) -> None:
        """Advance one run as far as it goes now; a failure pauses it alone."""
        if self._pauses.waiting(run.local_id):
            return
        with self._current_lock:
            self._current.append(run.local_id)
        try:
            self._advance(run)
        except Backoff as pause:
            self._pauses.pause(run, pause)
            self._note(run.local_id, str(pause.cause))
        except RunLeftSpool:
            # Its partition went to another member, which delivers it now.
            logger.info("Run %s left this member with its partition", shown(run.local_id))
            self._pauses.clear(run.local_id)
        except StopDelivery as stop:
            if run.closed:
                # Over on the platform: stopping would reopen it. Its late
                # episodes wait, with backoff, for the cause to go away.
                self._pauses.pause(run, Backoff(PlatformError(stop.reason)))
                return
            self._pauses.clear(run.local_id)
            stop_run(self._spool, run, stop.reason)
        except Exception as exc:
            # Whatever one run's data does, the runs after it are still
            # delivered: this run waits (with backoff) and is retried.
            logger.error(
                "Run %s: delivery failed (%s: %s); retrying later",
                shown(run.local_id),
                type(exc).__name__,
                shown(exc),
                exc_info=self._pauses.failures(run.local_id) == 0,
            )
            self._pauses.pause(run, Backoff(PlatformError(f"{type(exc).__name__}: {exc}")))
        else:
            self._pauses.clear(run.local_id)
            self._clear_note(run.local_id)
        finally:
            with self._current_lock:
                self._current.remove(run.local_id)

    # -- a platform that does not answer ----------------------------------------

    def platform_silent(self, what: str, seconds: float) -> None:
        """Called by :data:`.platform.watch.WATCH` while a request waits: say
        at once (not after the read timeout) that the platform cannot be
        reached, where the episodes are, and record it on the run."""
        with self._current_lock:
            local_ids = list(self._current)
        for local_id in local_ids:
            self._say_silent(local_id, what, seconds)

    def _say_silent(self, local_id: str, what: str, seconds: float) -> None:
        reason = (
            f"the platform at {self._base_url} has not answered {what} for {seconds:.0f}s: it "
            "cannot be reached from here now"
        )
        logger.warning(
            "Run %s: %s. Its episodes are kept locally in %s and delivered when the platform "
            "answers; if this process ends first, `prime-runs-otel push %s` delivers them later.",
            shown(local_id),
            reason,
            shown(str(self._spool.path)),
            shown(local_id),
        )
        self._note(local_id, reason)

    def platform_answers(self) -> None:
        if self._noted:
            logger.warning("The platform at %s answers again; delivery goes on", self._base_url)

    def _note(self, local_id: str, reason: str) -> None:
        """Record why the run waits as its ``last_error`` (``show``, the
        run's result), until it gets through."""
        try:
            self._spool.delivery.update_run(local_id, last_error=reason)
        except Exception as exc:  # the note is a courtesy: delivery goes on
            logger.debug("could not record the error on run %s: %s", local_id, exc)
            return
        self._noted.add(local_id)

    def _clear_note(self, local_id: str) -> None:
        if local_id in self._noted:
            self._noted.discard(local_id)
            self._spool.delivery.update_run(local_id, last_error=None)

    def _resend_inherited(self, run: RunRow) -> None:
        """Uploads the previous owner of the run's partition began: sent
        again with the same episodes in the same order, so the bytes and the
        idempotency key are the same and Prime Traces replays the receipt of
        one it stored instead of storing it twice."""
        assert self._owner is not None
        for upload_id, episode_ids in self._owner.inherited_uploads(run.local_id):
            rows = self._spool.handover.pending_in_order(run.local_id, episode_ids)
            if len(rows) != len(episode_ids):
                logger.warning(
                    "Run %s: %d of the %d episodes of upload %s of the previous owner are not "
                    "pending here; sending the others",
                    shown(run.local_id),
                    len(episode_ids) - len(rows),
                    len(episode_ids),
                    upload_id,
                )
            if rows:
                self._stream.send_exactly(run, rows)
            self._owner.resent(run.local_id, upload_id)

    def _fold_behind(self, run: RunRow, behind: int = FOLD_BEHIND) -> None:
        """Keep the viewer's aggregates of the run close behind its episodes
        (``folds.py``): once ``behind`` of them are unfolded (0: any, at the
        run's close), so a view never folds more than a few thousand. Here,
        on the delivery's thread, rather than in ``export()``'s commit, whose
        CPU the caller waits for; between the run's requests, never during
        one, in short transactions with a give-way to ``export()`` between.

        While the run is written, the spool is asked only once
        :data:`FOLD_LOOK_EVERY` more episodes came in since it was last
        asked (most passes see a few), and the fold starts that many short
        of ``behind``, so a view still finds ``behind`` unfolded at most."""
        if behind:
            looked = self._fold_looked.get(run.local_id)
            if looked is not None and run.episodes - looked < FOLD_LOOK_EVERY:
                return
            self._fold_looked[run.local_id] = run.episodes
            behind -= FOLD_LOOK_EVERY
        self._spool.reading.fold_behind(run.local_id, behind, self._between_folds)

    def _between_folds(self) -> bool:
        self._give_way()
        return self._stopping.is_set()

    def _advance(self, run: RunRow) -> None:
        lifecycle: RunLifecycle = self._training if run.kind == "train" else self._evals
        if self._owner is not None and not self._owner.owns(run.local_id):
            return  # another member of the fleet delivers it now
        self._fold_behind(run)
        if run.closed:
            # Closed with episodes that arrived after: delivered like any
            # other, to the closed run, if the platform takes them.
            if run.platform_id is not None:
                lifecycle.deliver(run)
            return
        if run.end_status is None:
            run = end_if_crashed(self._spool, run, self._idle_timeout)
        if run.mode != "online":
            if run.end_status is not None:
                self._fold_behind(run, 0)  # before the close a finish() waits for
                self._spool.delivery.update_run(
                    run.local_id, close_state="closed", closed_at=time.time()
                )
            return
        if run.create_state == "failed":
            # Refused for good before it existed: once ended, nothing more
            # will happen to it without `push`, so it leaves the delivery list.
            if run.end_status is not None and run.close_state != "gave_up":
                self._spool.delivery.update_run(run.local_id, close_state="gave_up")
            return
        if run.create_state in ("pending", "creating"):
            if self._owner is not None and self._owner.hold_create(run.local_id):
                return  # the previous owner's create may still land: looked up later
            lifecycle.create(run)
            run = reload(self._spool, run)
        if run.create_state != "created" or run.platform_id is None:
            return
        if self._owner is not None:
            self._resend_inherited(run)
        lifecycle.deliver(run)
