"""The spool of a fleet member: the same spool, with the gate of
:class:`.owner.RunOwner` in front of the steps after which a platform call
goes out that a new owner must know of: a Prime Traces upload (its episodes,
hence its bytes and idempotency key), a legacy sample request (which the
platform cannot make idempotent: a new owner counts its episodes uncertain
and never sends them again), a run's create and its finalize."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence
from functools import cached_property
from pathlib import Path

from ..backoff import Backoff
from ..platform.http import PlatformError
from ..spool import Spool, SpoolDelivery
from ..spool.core import SpoolCore
from ..spool.rows import chunks, placeholders
from .owner import NotOwned, RunOwner


class FleetSpool(Spool):
    def __init__(self, path: str | Path, owner: RunOwner, **options: object) -> None:
        super().__init__(path, **options)  # type: ignore[arg-type]
        self.owner = owner

    def _open(self, *, check_same_thread: bool = True) -> sqlite3.Connection:
        """A connection that does not wait for the disk at each commit
        (``synchronous=NORMAL``: in WAL mode a commit survives the process
        dying, not the machine; the file stays whole either way). A member's
        spool is a working copy: the records are in Kafka and a member
        empties its spool when it starts, so the wait for the disk bought
        nothing, and the consumer loop commits one transaction per record."""
        db = super()._open(check_same_thread=check_same_thread)
        if not self._read_only:
            db.execute("PRAGMA synchronous=NORMAL")
        return db

    @cached_property
    def delivery(self) -> FleetDelivery:
        return FleetDelivery(self, self.owner)

    def adopt(self, local_id: str, **values: object) -> None:
        """What another member did with the run, written without the gate
        (the consumer loop applies it; nothing goes out)."""
        SpoolDelivery.update_run(self.delivery, local_id, **values)


class FleetDelivery(SpoolDelivery):
    """The spool's delivery facet with the owner's gate in front."""

    def __init__(self, core: SpoolCore, owner: RunOwner) -> None:
        super().__init__(core)
        self.owner = owner

    def begin_traces_upload(
        self, run_id: str, seqs: Sequence[int], upload_id: str, body: bytes, *, encoding: str
    ) -> None:
        ids = self._episode_ids(seqs)
        try:
            self.owner.record(run_id, "upload", upload_id, ids)
        except NotOwned as exc:
            raise Backoff(PlatformError(f"not sent: {exc}"), delay=1.0) from exc
        super().begin_traces_upload(run_id, seqs, upload_id, body, encoding=encoding)

    def begin_samples_request(self, run_id: str, seqs: Sequence[int]) -> str:
        """The sample table appends: a request a member may have sent when it
        died must not go out again from the next owner, so its episodes are
        committed to Kafka as the run's *uncertain* ones first."""
        try:
            self.owner.record(run_id, "samples", "", self._episode_ids(seqs))
        except NotOwned as exc:
            raise Backoff(PlatformError(f"not sent: {exc}"), delay=1.0) from exc
        return super().begin_samples_request(run_id, seqs)

    def uncertain_elsewhere(self, run_id: str, episode_ids: Collection[str]) -> int:
        """Episodes another member may have stored in the sample table:
        pending here, they are counted uncertain and never sent. How many were."""
        wanted = list(episode_ids)
        count = 0
        with self._transaction() as db:
            for chunk in chunks(wanted):
                where = (
                    f"run_id = ? AND state = 'pending' AND episode_id IN ({placeholders(chunk)})"
                )
                count += db.execute(
                    f"UPDATE episodes SET state = 'uncertain' WHERE {where}", (run_id, *chunk)
                ).rowcount
            db.execute(
                "UPDATE runs SET uncertain = uncertain + ? WHERE local_id = ?", (count, run_id)
            )
        return count

    def count_uncertain_before(self, run_id: str, count: int) -> None:
        """Episodes earlier owners counted uncertain in records this member
        skips (up to the state's ``through``): added to the run's count, which
        would miss them otherwise. Added, not set, beside the uploader's own."""
        if count:
            with self._transaction() as db:
                db.execute(
                    "UPDATE runs SET uncertain = uncertain + ? WHERE local_id = ?", (count, run_id)
                )

    def claim_create(self, local_id: str) -> bool:
        try:
            self.owner.record(local_id, "create")
        except NotOwned as exc:
            raise Backoff(PlatformError(f"not created: {exc}"), delay=1.0) from exc
        return super().claim_create(local_id)

    def update_run(self, local_id: str, **values: object) -> None:
        """A run about to be finalized (``/finalize`` is not idempotent) is
        recorded in Kafka first: a new owner reads the run's status back
        before it finalizes, as after an ambiguous answer."""
        if values.get("close_state") == "finalizing":
            try:
                self.owner.record(local_id, "close")
            except NotOwned as exc:
                raise Backoff(PlatformError(f"not finalized: {exc}"), delay=1.0) from exc
        super().update_run(local_id, **values)

    def _episode_ids(self, seqs: Sequence[int]) -> list[str]:
        by_seq: dict[int, str] = {}
        for chunk in chunks(seqs):
            rows = self._query(
                f"SELECT seq, episode_id FROM episodes WHERE seq IN ({placeholders(chunk)})",
                tuple(chunk),
            )
            by_seq.update({seq: episode_id for seq, episode_id in rows})
        return [by_seq[seq] for seq in seqs if seq in by_seq]
