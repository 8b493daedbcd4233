"""The delivery lease: which process delivers a spool's runs right now.

Several processes may share one spool (forked workers, ``serve`` beside an
eval, ``push``). Two of them delivering at once would send the same episodes
twice and race each other's creates, so one at a time holds the spool's lease
and the others wait their turn. The lease expires unless renewed, so a holder
that dies hands over by itself; a holder renews it during long passes and
before large uploads, so it is not taken away mid-request.
"""

from __future__ import annotations

import logging
import os

from .spool import Spool, lease_owner

logger = logging.getLogger(__name__)


class Lease:
    """This process's claim on the delivery lease of ``spool``."""

    def __init__(self, spool: Spool, ttl: float) -> None:
        self._spool = spool
        self._ttl = ttl
        self._owners: dict[int, str] = {}

    @property
    def owner(self) -> str:
        """The lease name of this holder in this process: a forked copy of it
        is another holder, never the parent's."""
        pid = os.getpid()
        owner = self._owners.get(pid)
        if owner is None:
            owner = self._owners[pid] = lease_owner()
        return owner

    def acquire(self) -> bool:
        """Take or renew the lease; ``False`` while another process holds it."""
        return self._spool.acquire_lease(self.owner, self._ttl)

    def renew(self) -> None:
        """Keep the lease for a while longer (a long pass, a large upload)."""
        self._spool.acquire_lease(self.owner, self._ttl)

    def release(self) -> None:
        """Hand the lease over now rather than when it expires."""
        try:
            self._spool.release_lease(self.owner)
        except Exception as exc:
            logger.debug("releasing the uploader lease failed: %s", exc)
