"""Which runs this member delivers now, and the gate in front of the platform
calls that must not happen twice.

The consumer loop (``collector/kafka_member.py``) says which partitions this
member owns and which runs live in them (``collector/kafka_books.py`` keeps
their books); the uploader asks :meth:`owns` before it touches a run, so a
run whose partition was revoked is left alone from its next step on, with no
wait on the consumer's side. Before an upload is persisted, a legacy sample
request is begun, or a create is sent, the uploader records it
(:meth:`record`): the consumer loop puts it in the run's state and commits it
to Kafka, and only then does the call go out. A member that takes the
partition over therefore knows every upload and sample request that may be
stored, and every create and finalize that may have happened.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .state import RunState

#: What an intent announces: a Prime Traces upload, a run's create or
#: finalize, or a legacy sample request.
Kind = Literal["upload", "create", "close", "samples"]

#: Runs a member's uploader advances at once. Each upload, create and
#: finalize waits for a Kafka transaction before it goes out; several runs
#: waiting together share one (and their uploads then overlap), where one
#: run at a time paid a transaction per call.
FLEET_DELIVERY_WORKERS = 4
#: How long a record may wait for the consumer loop's commit.
RECORD_TIMEOUT = 30.0
#: How long a new owner waits before it looks up a run whose create another
#: member was about to send: longer than a create request may take (the
#: platform client's timeout), so the lookup sees a create that went through.
CREATE_GRACE = 35.0


class NotOwned(RuntimeError):
    """The run's partition is not this member's (any more), or its state
    could not be committed: the call must not go out."""


class RunOwner(Protocol):
    """What the uploader asks of a fleet (a member without one owns all)."""

    def owns(self, run_key: str) -> bool: ...

    def hold_create(self, run_key: str) -> bool: ...

    def inherited_uploads(self, run_key: str) -> list[tuple[str, list[str]]]: ...

    def resent(self, run_key: str, upload_id: str) -> None: ...

    def record(
        self,
        run_key: str,
        kind: Kind,
        upload_id: str = "",
        episode_ids: Sequence[str] = (),
    ) -> None: ...


@dataclass
class Intent:
    """A platform call the uploader is about to make, waiting for its commit."""

    run_key: str
    kind: Kind
    upload_id: str
    episode_ids: list[str]
    at: float = field(default_factory=time.time)
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class FleetOwnership:
    """Shared by the consumer loop and the uploader (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Partitions assigned and caught up: their runs are delivered here.
        self._ready: set[int] = set()
        #: The partition of every run seen, by run key.
        self._partition_of: dict[str, int] = {}
        #: States a previous owner left, by run key, until applied.
        self._inherited: dict[str, RunState] = {}
        self._intents: list[Intent] = []
        #: Set when an intent waits: the consumer loop commits at once.
        self.wanted = threading.Event()

    # -- the consumer loop's side -----------------------------------------------------

    def bind(self, run_key: str, partition: int) -> None:
        with self._lock:
            self._partition_of[run_key] = partition

    def ready(self, partition: int) -> None:
        with self._lock:
            self._ready.add(partition)

    def revoke(self, partition: int) -> list[str]:
        """Stop delivering the partition's runs; returns their keys. Intents
        of its runs still waiting are refused."""
        with self._lock:
            self._ready.discard(partition)
            runs = [key for key, part in self._partition_of.items() if part == partition]
            for key in runs:
                del self._partition_of[key]
                self._inherited.pop(key, None)
            waiting = [intent for intent in self._intents if intent.run_key in runs]
            self._intents = [intent for intent in self._intents if intent.run_key not in runs]
        for intent in waiting:
            intent.error = "the run's partition went to another member"
            intent.done.set()
        return runs

    def inherit(self, state: RunState) -> None:
        with self._lock:
            self._inherited[state.run] = state

    def inherited(self, run_key: str) -> RunState | None:
        with self._lock:
            return self._inherited.get(run_key)

    def partition_of(self, run_key: str) -> int | None:
        with self._lock:
            return self._partition_of.get(run_key)

    def take_intents(self) -> list[Intent]:
        with self._lock:
            intents, self._intents = self._intents, []
            self.wanted.clear()
            return intents

    # -- the uploader's side ----------------------------------------------------------

    def owns(self, run_key: str) -> bool:
        with self._lock:
            partition = self._partition_of.get(run_key)
            return partition is not None and partition in self._ready

    def hold_create(self, run_key: str) -> bool:
        """Whether a create must wait: the previous owner was about to send
        one less than :data:`CREATE_GRACE` ago, and its answer is unknown."""
        state = self.inherited(run_key)
        if state is None or state.creating_at is None or state.platform_id is not None:
            return False
        return time.time() - state.creating_at < CREATE_GRACE

    def inherited_uploads(self, run_key: str) -> list[tuple[str, list[str]]]:
        state = self.inherited(run_key)
        return [] if state is None else list(state.sending)

    def resent(self, run_key: str, upload_id: str) -> None:
        with self._lock:
            state = self._inherited.get(run_key)
            if state is not None:
                state.sending = [item for item in state.sending if item[0] != upload_id]

    def record(
        self,
        run_key: str,
        kind: Kind,
        upload_id: str = "",
        episode_ids: Sequence[str] = (),
    ) -> None:
        """Block until the intent is committed to Kafka; :class:`NotOwned`
        when it was not (the call must then not be made)."""
        intent = Intent(run_key, kind, upload_id, list(episode_ids))
        with self._lock:
            if self._partition_of.get(run_key) not in self._ready:
                raise NotOwned(f"run {run_key} is not delivered by this member now")
            self._intents.append(intent)
            self.wanted.set()
        if not intent.done.wait(RECORD_TIMEOUT):
            with self._lock:
                if intent in self._intents:
                    self._intents.remove(intent)
            raise NotOwned(f"recording the {kind} of run {run_key} in Kafka took too long")
        if intent.error is not None:
            raise NotOwned(intent.error)
