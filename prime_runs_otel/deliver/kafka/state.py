"""A run's handover record: what the member that delivers a run has done
with it, as the next owner of its partition needs it.

One record per run in the compacted ``<prefix>.runs`` topic, keyed by the run
key, written in the same Kafka transaction as the consumer offsets it goes
with. ``through``: every record of the run in its partition up to this
offset is delivered, so a new owner skips them; ``delivered``: episodes of
later records that are delivered too (marked so without a request);
``sending``: uploads begun and not confirmed, each with its episodes in line
order, so the new owner sends the same bytes under the same idempotency key
and Prime Traces replays its receipt; ``creating_at``: when a create request
was about to go out with no platform run id known yet; ``uncertain``:
episodes a legacy sample request may have stored (begun, its answer not
known), or counted uncertain already: the sample table appends, so a new
owner never sends them again and counts them uncertain, as one process does
after a restart (``deliver/sinks/samples.py``); ``uncertain_before``: how
many episodes this owner and those before it counted uncertain in records up
to ``through``, which the next owner never reads again: it adds them to the
run's count, so the run's final count holds every one, once; ``controls``:
the offsets, up to ``through``, of records that carry a run's start, end or
metrics and are not done (done once the run is closed): a new owner reads
them again, and skips the rest up to ``through``. Without it a run's start
(its first record) held ``through`` back until the run closed, and every
state listed every episode of the run delivered so far: each commit cost
time in the run's size, and a long run's state outgrew a Kafka message.

Versions: a member reads the states of its own layout and of every earlier
one, the fields an earlier layout lacks defaulted (during a rolling upgrade
the next owner of a run may be new and its state old; refused, the run would
be taken over as if nobody had delivered it). A state of a later layout is
refused, saying so: its fields may mean what this member cannot know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

#: 1: up to ``uncertain`` (``finalizing`` and ``uncertain`` were added
#: without a bump, and read as their defaults when absent); 2: ``uncertain_before``;
#: 3: ``controls``.
VERSION = 3


@dataclass
class RunState:
    run: str
    partition: int
    through: int = -1
    platform_id: str | None = None
    url: str | None = None
    closed: bool = False
    traces_written: int = 0
    delivered: list[str] = field(default_factory=list)
    sending: list[tuple[str, list[str]]] = field(default_factory=list)
    creating_at: float | None = None
    #: A finalize may have gone out: a new owner reads the status back first.
    finalizing: bool = False
    #: Never sent again: a legacy sample request may have stored them.
    uncertain: list[str] = field(default_factory=list)
    #: Counted uncertain in records up to ``through`` (version 2; 0 before).
    uncertain_before: int = 0
    #: Records up to ``through`` read again: a run's start, end or metrics (version 3).
    controls: list[int] = field(default_factory=list)

    def encode(self) -> bytes:
        """The record's value. Written at every commit of the run's progress,
        with ``delivered`` growing to every episode of a long run: the fields
        go to ``json`` as they are (``dataclasses.asdict`` deep-copied each
        id first, and was most of a commit's encoding: 15% of a member's
        delivery thread at 1,000 episodes/s, by sampling)."""
        data = {"v": VERSION, **{item.name: getattr(self, item.name) for item in fields(self)}}
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> RunState:
        data: dict[str, Any] = json.loads(value)
        version = data.pop("v", None)
        if type(version) is not int or not 1 <= version <= VERSION:
            raise ValueError(
                f"a run state of version {version!r}, which this member (version {VERSION}) "
                "cannot read: a member of a later release wrote it. Upgrade this member "
                "to the release of the others in the fleet."
            )
        data["sending"] = [(str(upload), list(ids)) for upload, ids in data.get("sending", [])]
        return cls(**data)
