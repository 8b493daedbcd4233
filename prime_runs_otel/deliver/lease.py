"""The delivery lease: which process delivers a spool's runs right now.

Several processes may share one spool (forked workers, ``serve`` beside an
eval, ``push``). Two of them delivering at once would send the same episodes
twice and race each other's creates, so one at a time holds the spool's lease
and the others wait their turn. The lease expires unless renewed, so a holder
that dies hands over by itself; a holder renews it during long passes and
before large uploads, so it is not taken away mid-request.

A renewal is a committed transaction (an fsync of the spool's log), and a
streaming run's upload asked for two or three of them: a holder that renewed
less than a quarter of the lease's life ago is sure to hold it still, so it
renews again only after that.
"""

from __future__ import annotations

import logging
import os
import time

from .spool import Spool, lease_owner

logger = logging.getLogger(__name__)


class Lease:
    """This process's claim on the delivery lease of ``spool``."""

    #: The share of ``ttl`` within which a holder's last renewal stands.
    RENEW_AFTER = 0.25

    def __init__(self, spool: Spool, ttl: float) -> None:
        self._spool = spool
        self._ttl = ttl
        self._owners: dict[int, str] = {}
        #: When each holder (by owner) last took or renewed the lease (monotonic).
        self._renewed: dict[str, float] = {}

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
        """Take or renew the lease; ``False`` while another process holds it.
        Within ``RENEW_AFTER`` of ``ttl`` of the last renewal the lease is
        still this holder's, and nothing is written."""
        owner = self.owner
        renewed = self._renewed.get(owner)
        if renewed is not None and time.monotonic() - renewed < self._ttl * self.RENEW_AFTER:
            return True
        now = time.monotonic()
        taken = self._spool.delivery.acquire_lease(owner, self._ttl)
        if taken:
            self._renewed[owner] = now
        else:
            self._renewed.pop(owner, None)
        return taken

    def renew(self) -> None:
        """Keep the lease for a while longer (a long pass, a large upload)."""
        self.acquire()

    def release(self) -> None:
        """Hand the lease over now rather than when it expires."""
        self._renewed.pop(self.owner, None)
        try:
            self._spool.delivery.release_lease(self.owner)
        except Exception as exc:
            logger.debug("releasing the uploader lease failed: %s", exc)
