"""Which ``serve`` of a fleet owns each run: a claim file per run in a folder
every ``serve`` of the fleet shares (``serve --fleet-dir``).

A run must have one owner: the one ``serve`` whose spool creates the
platform run, numbers its episodes and closes it. The platform cannot help:
the RFT API cannot find a training run again, and no create is refused as a
second one, so two processes creating at the same instant both succeed.
A load balancer keeps a run on one backend only until its backend list
changes. So the first ``serve`` to see a run claims it here, atomically
(a hard link, which fails when the claim exists: one winner however many
try at once, also over NFS), and every other ``serve`` that gets spans of
the run forwards them to the owner (``collector/forward.py``). Claims are
never taken away: a ``serve`` that comes back under the same name
(``--fleet-name``) owns its runs again; a run whose owner is gone for good
is taken over only by a ``serve`` started under that name.

The owner records the platform run in the claim once it has one, so a
replacement with an empty spool adopts it instead of creating a second one.
Each member writes where it is reached (its OTLP/HTTP address) under
``members/``, rewritten on every start, so an owner that comes back on a
new address is still found.

The folder holds small JSON files only, written to a temporary name and
linked or renamed into place: a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

logger = logging.getLogger(__name__)

#: Run keys whose owner this process remembers without reading the folder.
_CACHED_OWNERS = 100_000


@dataclass(frozen=True)
class Claim:
    """A run's claim: its owner and, once created, the platform run."""

    run_key: str
    owner: str
    platform_id: str | None = None
    url: str | None = None


class FleetError(Exception):
    """The shared folder cannot be read or written now (a network file
    system away): nothing is decided, the request is retried."""


class Fleet:
    """This ``serve``'s view of the fleet folder: its own name and address,
    the claims, and where the other members are reached."""

    def __init__(self, directory: str | os.PathLike[str], name: str, address: str) -> None:
        self.directory = Path(directory)
        self.name = name
        self.address = address
        self._owners: dict[str, str] = {}
        self._addresses: dict[str, str] = {}
        self._lock = threading.Lock()
        try:
            for folder in (self._runs, self._members, self._scratch):
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot use the fleet folder {str(self.directory)!r}: {exc}. Give every serve "
                "of the fleet the same writable folder (a shared volume) with --fleet-dir"
            ) from exc

    @property
    def _runs(self) -> Path:
        return self.directory / "runs"

    @property
    def _members(self) -> Path:
        return self.directory / "members"

    @property
    def _scratch(self) -> Path:
        return self.directory / "tmp"

    # -- members ---------------------------------------------------------------------

    def join(self) -> None:
        """Say where this member is reached (rewritten on every start)."""
        self._write(
            self._members / f"{_file_name(self.name)}.json",
            {"name": self.name, "address": self.address, "pid": os.getpid(), "at": time.time()},
            replace=True,
        )

    def address_of(self, name: str, *, fresh: bool = False) -> str | None:
        """Where member ``name`` is reached, as it last said; ``fresh`` reads
        the folder again (after a failed forward: it may have moved)."""
        if name == self.name:
            return self.address
        if not fresh:
            known = self._addresses.get(name)
            if known is not None:
                return known
        document = self._read(self._members / f"{_file_name(name)}.json")
        if document is None:
            return None
        address = str(document["address"])
        self._addresses[name] = address
        return address

    # -- claims ----------------------------------------------------------------------

    def owner_of(self, run_key: str) -> str:
        """The name of the member that owns ``run_key``, claiming it for this
        one if nobody has yet. Raises :class:`FleetError` when the folder
        cannot answer."""
        owner = self._owners.get(run_key)
        if owner is not None:
            return owner
        claim = self.claim_of(run_key)
        if claim is None:
            claim = self._claim(run_key)
        with self._lock:
            if len(self._owners) >= _CACHED_OWNERS:
                self._owners.clear()
            self._owners[run_key] = claim.owner
        return claim.owner

    def owns(self, run_key: str) -> bool:
        return self.owner_of(run_key) == self.name

    def claim_of(self, run_key: str) -> Claim | None:
        document = self._read(self._claim_path(run_key))
        if document is None:
            return None
        return Claim(
            run_key=str(document["run_key"]),
            owner=str(document["owner"]),
            platform_id=document.get("platform_id"),
            url=document.get("url"),
        )

    def record_created(self, run_key: str, platform_id: str, url: str | None) -> None:
        """The owner has the platform run: a replacement under its name adopts
        it instead of creating another."""
        claim = self.claim_of(run_key)
        if claim is None or claim.owner != self.name or claim.platform_id == platform_id:
            return
        self._write(
            self._claim_path(run_key),
            {
                "run_key": run_key,
                "owner": self.name,
                "platform_id": platform_id,
                "url": url,
                "at": time.time(),
            },
            replace=True,
        )

    def _claim(self, run_key: str) -> Claim:
        document = {"run_key": run_key, "owner": self.name, "at": time.time()}
        if self._write(self._claim_path(run_key), document, replace=False):
            logger.info("Run %s: claimed by this serve (%s)", run_key, self.name)
            return Claim(run_key, self.name)
        claim = self.claim_of(run_key)
        if claim is None:
            raise FleetError(f"the claim of run {run_key} vanished from {self.directory}")
        return claim

    def _claim_path(self, run_key: str) -> Path:
        digest = hashlib.sha256(run_key.encode("utf-8", "surrogatepass")).hexdigest()
        return self._runs / digest[:2] / f"{digest}.json"

    # -- files -----------------------------------------------------------------------

    def _write(self, path: Path, document: dict[str, Any], *, replace: bool) -> bool:
        """Write ``document`` to ``path`` whole. ``replace=False`` succeeds
        only if nobody wrote ``path`` first (``False`` then)."""
        scratch = self._scratch / f"{uuid.uuid4().hex}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(scratch, "wb") as handle:
                handle.write(json.dumps(document).encode())
                handle.flush()
                os.fsync(handle.fileno())
            if replace:
                os.replace(scratch, path)
                return True
            try:
                os.link(scratch, path)
            except FileExistsError:
                return False
            finally:
                scratch.unlink(missing_ok=True)
            return True
        except OSError as exc:
            scratch.unlink(missing_ok=True)
            raise FleetError(f"cannot write {path} in the fleet folder: {exc}") from exc

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FleetError(f"cannot read {path} in the fleet folder: {exc}") from exc
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise FleetError(f"{path} in the fleet folder is damaged: {exc}") from exc
        if not isinstance(document, dict):
            raise FleetError(f"{path} in the fleet folder is damaged")
        return document


def _file_name(name: str) -> str:
    """A member name as a file name (any name, no path tricks)."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
