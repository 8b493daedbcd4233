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
    spool.fail_episodes(run.local_id, [episode.seq], reason)
    logger.error("Run %s: %s; counted as failed", shown(run.local_id), shown(reason))
