"""Prime Traces, the system of record: a run's episodes as gzipped uploads of
episode lines, exactly once.

An upload's bytes are stored in the spool, keyed by their digest, before the
first attempt; a retry, in this process or the next, sends the same bytes
again, and the service answers a replay from its receipt instead of storing
twice. An upload is all or nothing, so one bad episode refuses all the
others with it: an upload refused for its content is sent again in halves
until the episode responsible is alone, and only that one fails. A refusal
about the set-up (a key, an address) fails no episode: the run's delivery
stops with them kept (``refusals.py``). An account that is not on Prime
Traces is told by its first upload, and the run goes to the legacy sample
table instead (:mod:`.samples`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ..._json import loads as fast_loads
from ...read.projection import traces_line
from ..backoff import Backoff
from ..clients import PlatformClients
from ..lease import Lease
from ..lines import LineCache
from ..platform.http import PlatformError
from ..platform.traces import SERVICE_NOT_ENABLED, compress_lines, upload_key
from ..refusals import Narrowing, StopDelivery, about_content, refused_setup
from ..spool import EpisodeRow, RunRow, Spool, UploadRow
from .base import fail_unsendable, narrow, refused_late

logger = logging.getLogger(__name__)

#: Prime Traces takes uploads up to 256 MiB (a line up to 64 MiB). Uploads
#: close near 2 MiB of lines here: a streaming run wants each episode on the
#: platform soon, and claiming or committing an upload is one transaction
#: that export() may wait behind (8 MiB made its p99 twice as long).
TRACES_BATCH_BYTES = 2 * 1024 * 1024
MAX_TRACES_LINE_BYTES = 64 * 1024 * 1024
#: The service's per-upload line cap is 1,000,000; batches close on bytes first.
MAX_BATCH_EPISODES = 100_000


class TracesSink:
    """Episode lines to Prime Traces. ``lines`` holds the lines the exporter
    in this process built already; ``give_way`` lets ``export()`` have the
    GIL between episodes."""

    def __init__(
        self,
        spool: Spool,
        clients: PlatformClients,
        lease: Lease,
        lines: LineCache,
        give_way: Callable[[], None],
        narrowing: Narrowing,
    ) -> None:
        self._spool = spool
        self._clients = clients
        self._lease = lease
        self._lines = lines
        self._give_way = give_way
        self._narrowing = narrowing
        #: Uploads begun in this process none of whose attempts may have
        #: acted: only these may be split. One that may be stored already (an
        #: ambiguous failure, or left open by an earlier process) is only ever
        #: sent again whole, or the service could store its episodes twice.
        self._unsent: set[str] = set()

    def send(self, run: RunRow, episodes: Sequence[EpisodeRow]) -> None:
        assert run.platform_id is not None
        lines: list[bytes] = []
        seqs: list[int] = []
        for episode in episodes:
            self._give_way()
            template = self._lines.take(episode.seq)
            line = template.fill(run.platform_id, run.kind, episode.step) if template else None
            if line is None:
                try:
                    line = traces_line(
                        fast_loads(episode.record), run.platform_id, run.kind, step=episode.step
                    )
                except Exception as exc:  # a stored record is outside input too
                    fail_unsendable(self._spool, run, episode, exc)
                    continue
            if len(line) - 1 > MAX_TRACES_LINE_BYTES:
                self._spool.delivery.fail_episodes(
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
        self._spool.delivery.begin_traces_upload(
            run.local_id, seqs, upload_id, compressed, encoding="gzip"
        )
        self._unsent.add(upload_id)
        self._send(run, upload_id, compressed)

    def resume(self, run: RunRow, upload: UploadRow) -> None:
        """The stored bytes again, so the service replays its receipt."""
        if upload.body is None:
            return
        # A body stored plain was written by an earlier release.
        compressed = upload.body if upload.body_encoding == "gzip" else compress_lines(upload.body)
        self._send(run, upload.upload_id, compressed)

    def _send(self, run: RunRow, upload_id: str, compressed: bytes) -> None:
        traces = self._clients.traces()
        self._lease.renew()  # a large upload may take a while: keep the lease for its length
        try:
            traces.upload_episodes(compressed, upload_id, self._context(run))
        except PlatformError as exc:
            if exc.status == 403 and exc.code == SERVICE_NOT_ENABLED and run.traces_written == 0:
                logger.info(
                    "Run %s: Prime Traces is not enabled for this account; its episodes go to "
                    "the legacy sample table instead",
                    run.local_id,
                )
                self._spool.delivery.abandon_traces_uploads(run.local_id, sink="samples")
                self._lines.clear()
                return
            if exc.ambiguous:
                self._unsent.discard(upload_id)
            if exc.retryable:
                raise Backoff(exc) from exc
            self._refused(run, upload_id, exc)
            return
        self._unsent.discard(upload_id)
        self._spool.delivery.commit_traces_upload(run.local_id, upload_id)
        self._narrowing.delivered(run.local_id)

    def _refused(self, run: RunRow, upload_id: str, exc: PlatformError) -> None:
        """An upload refused for good. Its episodes fail only when the answer
        is about them, and it is split or given up only when no attempt of
        it may have been stored; otherwise it stays as it is, for ``push``
        to send again whole (the service replays a stored one's receipt)."""
        seqs = self._spool.delivery.upload_episode_seqs(upload_id)
        if run.closed and not about_content(exc):
            self._unsent.discard(upload_id)
            refused_late(self._spool, run, seqs, exc)
            return
        if not about_content(exc):
            raise refused_setup(exc, "the Prime Traces upload")
        if upload_id not in self._unsent:
            raise StopDelivery(
                f"the Prime Traces upload of {len(seqs)} episode(s) was refused ({exc}) after "
                "an earlier attempt of it may have been stored; it is kept whole rather than "
                "split or failed (either could store its episodes twice, or lose them)"
            )
        self._unsent.discard(upload_id)
        if len(seqs) > 1:
            # One bad episode refuses the whole upload: halve until it is alone.
            narrow(self._spool, self._narrowing, run, upload_id, exc, "an upload")
            return
        self._spool.delivery.fail_episodes(run.local_id, seqs, f"Prime Traces refused: {exc}")
        logger.error(
            "Run %s: Prime Traces refused %d episode(s) for good (%s); they are counted as "
            "failed and kept in the spool",
            run.local_id,
            len(seqs),
            exc,
        )

    @staticmethod
    def _context(run: RunRow) -> dict[str, str]:
        context = {"source": "prime-runs-otel", "run_type": run.kind}
        if run.identity.framework:
            context["framework"] = run.identity.framework
        if run.identity.model:
            context["model"] = run.identity.model
        return context
