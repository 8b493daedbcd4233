"""A run's episodes on their way out: one request's worth at a time from the
spool to the run's sink, after whatever an earlier attempt left open.

Eval and training runs stream the same way; they differ in what comes
before (creating the run) and after (closing it), which is theirs to do
(``eval_run.py``, ``training_run.py``). A run gets a bounded number of
requests per delivery pass, so one busy run cannot starve the others.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..config import Settings
from .clients import PlatformClients
from .lease import Lease
from .lifecycle import reload
from .lines import LineCache
from .refusals import Narrowing
from .sinks import (
    MAX_BATCH_EPISODES,
    SAMPLES_BATCH_BYTES,
    TRACES_BATCH_BYTES,
    SamplesSink,
    Sink,
    StepTablesSink,
    TracesSink,
)
from .spool import EpisodeRow, RunRow, Spool

#: Requests one run may send per delivery pass before the next run's turn.
BATCHES_PER_PASS = 16


class EpisodeStream:
    """The episode stream of every run of one spool.

    ``stopping`` ends a run's turn early (the uploader is stopping);
    ``more_pending`` is called when a run used its turn with episodes left,
    so the next pass starts at once.
    """

    def __init__(
        self,
        spool: Spool,
        settings: Settings,
        clients: PlatformClients,
        lease: Lease,
        lines: LineCache,
        *,
        give_way: Callable[[], None],
        stopping: threading.Event,
        more_pending: Callable[[], None],
    ) -> None:
        self._spool = spool
        self._traces_opt_out = settings.traces_opt_out
        self._lease = lease
        self._lines = lines
        self._stopping = stopping
        self._more_pending = more_pending
        #: Shared by the sinks: a run has one sink at a time.
        self._narrowing = Narrowing(MAX_BATCH_EPISODES)
        self._traces = TracesSink(spool, clients, lease, lines, give_way, self._narrowing)
        self._samples = SamplesSink(spool, clients, lease, self._narrowing)
        self._step_tables = StepTablesSink(spool, clients, self._narrowing)
        #: Which sink finishes an open upload, by the upload's kind.
        self._resumers: dict[str, Sink] = {
            "traces": self._traces,
            "samples": self._samples,
            "steps": self._step_tables,
        }

    def resume(self, run: RunRow) -> None:
        """Finish what an earlier attempt (or process) left open."""
        for upload in self._spool.delivery.open_uploads(run.local_id):
            sink = self._resumers.get(upload.kind)
            if sink is not None:
                sink.resume(run, upload)

    def deliver_some(self, run: RunRow) -> bool:
        """Up to ``BATCHES_PER_PASS`` requests for this run, so one busy run
        cannot starve the others; ``True`` when nothing was left pending."""
        for turn in range(BATCHES_PER_PASS):
            run = reload(self._spool, run)
            episodes = self._pending(run)
            if not episodes:
                return True
            if turn:
                # A pass can be long: keep the WAL short between its requests.
                # Not after the last one, which the end of the pass checkpoints
                # (Uploader.deliver_once), and at most once a second
                # (CHECKPOINT_PACE): a checkpoint waits for the disk, and an
                # episode that comes meanwhile waits for it.
                self._spool.checkpoint(paced=True)
                self._lease.renew()
            self._sink_for(run).send(run, episodes)
            if self._stopping.is_set():
                return False
        self._more_pending()  # more is pending: the next pass starts at once
        return False

    def send_exactly(self, run: RunRow, episodes: list[EpisodeRow]) -> None:
        """One request of exactly ``episodes``, in that order (an upload
        another member of a fleet began, formed again)."""
        self._sink_for(run).send(run, episodes)

    def _pending(self, run: RunRow) -> list[EpisodeRow]:
        """One request's worth of the run's pending episodes (none: nothing pending)."""
        budget = TRACES_BATCH_BYTES if run.sink == "traces" else SAMPLES_BATCH_BYTES
        limit = self._narrowing.limit(run.local_id)
        return self._spool.delivery.pending_episodes(
            run.local_id, max_bytes=budget, max_count=limit
        )

    def _sink_for(self, run: RunRow) -> Sink:
        """The run's sink. Every run starts on Prime Traces; one opted out of
        it (``PRIME_TRACES_OPT_OUT``) is moved to the legacy table here, for good."""
        if run.sink == "traces" and not self._traces_opt_out:
            return self._traces
        if run.sink == "traces":
            self._spool.delivery.update_run(run.local_id, sink="samples")
            self._lines.clear()
        return self._step_tables if run.kind == "train" else self._samples
