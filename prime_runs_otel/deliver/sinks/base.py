"""What every sink is: the two calls the episode stream makes of it, and the
one failure every sink treats alike.

A sink owns one destination's requests end to end: how episodes are batched
for it, what the spool records before each request so a restart neither loses
nor repeats one, and what each of the destination's answers does to the
episodes sent (delivered, failed for good, uncertain, or sent again after a
pause).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from ..._text import shown
from ..platform.http import PlatformError
from ..refusals import Narrowing
from ..spool import EpisodeRow, RunRow, Spool, UploadRow

logger = logging.getLogger(__name__)


class Sink(Protocol):
    def send(self, run: RunRow, episodes: Sequence[EpisodeRow]) -> None:
        """Send ``episodes`` of ``run`` (one request's worth, as the spool
        gave them); each ends delivered, failed, or pending for a retry."""
        ...

    def resume(self, run: RunRow, upload: UploadRow) -> None:
        """Finish ``upload``, which an earlier attempt (or process) left open."""
        ...


def fail_unsendable(spool: Spool, run: RunRow, episode: EpisodeRow, exc: BaseException) -> None:
    """One stored episode that cannot be sent fails alone, with its reason;
    the rest of its run, and every run after it, go on."""
    reason = (
        f"episode {episode.episode_id} cannot be sent as stored ({type(exc).__name__}: "
        f"{exc}); the spool keeps it for inspection"
    )
    spool.delivery.fail_episodes(run.local_id, [episode.seq], reason)
    logger.error("Run %s: %s; counted as failed", shown(run.local_id), shown(reason))


def refused_late(spool: Spool, run: RunRow, seqs: Sequence[int], exc: PlatformError) -> None:
    """Late episodes (their run was closed before they arrived) refused by
    the platform, for whatever reason that is not the moment's: the closed
    run takes no more (a 409), or the request failed on the set-up. A closed
    run is not stopped for ``push`` as an open one is (it is over on the
    platform), so they fail, counted ``late_refused``, kept in the spool."""
    spool.delivery.fail_episodes(run.local_id, seqs, f"late for the closed run, and refused: {exc}")
    logger.error(
        "Run %s: %d episode(s) that arrived after the run was closed were refused (%s); they "
        "are counted as late_refused and kept in the spool",
        shown(run.local_id),
        len(seqs),
        exc,
    )


def narrow(
    spool: Spool,
    narrowing: Narrowing,
    run: RunRow,
    upload_id: str,
    exc: PlatformError,
    what: str,
) -> None:
    """``what`` (an upload of several episodes) was refused whole for its
    content, so nothing of it was stored: its episodes go back to pending,
    and the run's next requests carry half as many, until the episode
    responsible is alone."""
    sent = len(spool.delivery.upload_episode_seqs(upload_id))
    narrowing.refused(run.local_id, sent)
    spool.delivery.release_upload(upload_id)
    logger.info(
        "Run %s: %s of %d episodes was refused (%s); retrying in halves to isolate the "
        "episode responsible",
        shown(run.local_id),
        what,
        sent,
        exc,
    )
