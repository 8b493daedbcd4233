"""The spool: a SQLite file that holds every run, episode and upload until the
platform has acknowledged it, and that doubles as the local store.

One module per table or job (each facet below is made of their shares):

- ``core``: connections, transactions, the fork gate; ``schema``: the tables
  and the migrations of a spool written by an earlier release.
- ``runs``: one row per producer run key, its lifecycle and running summary.
- ``episodes``: one row per (run, episode id) and its record body.
- ``ingest``: ``export()``'s one-transaction write of a whole batch;
  ``cap``: what it does at the size cap.
- ``uploads``: the open uploads of a run, of any kind; ``traces``: Prime
  Traces uploads (exactly once); ``samples``: legacy sample requests (at most
  once); ``steps``: training step metrics and sample-table objects.
- ``processes``: which processes feed a run, and the delivery lease.
- ``size``: the size cap, and the room kept on the spool's disk for
  delivery; ``tallies``: counts over the whole spool, for watching it
  (``serve``'s /metrics).
- ``space``: giving the file's free pages back to the disk (``rm``,
  ``prune``, ``compact``).
- ``views``: the facts and aggregates the local viewer and ``show`` read of
  a run (its episodes' facts, distributions, errors, series, per-example
  rewards), kept up to date by ``ingest``; ``view_reads``: reading them;
  ``rows``: the multi-row statements both use.
- ``part``: what every share reaches the core through; ``facets``: the
  facets made of them.

Composition: :class:`Spool` is the core (connections, transactions, the
file's settings) with one facet per kind of question its callers ask
(``facets.py``): ``spool.intake`` (what producers write), ``spool.delivery``
(what the uploader asks and records), ``spool.steps`` (the same for a
training run's steps), ``spool.handover`` (a fleet member taking over a
run), ``spool.reading`` (what the store commands and the viewer read) and
``spool.housekeeping`` (removal, the cap and the disk, space, counts). A
facet is made of the table modules' shares of its question, each a
:class:`~.part.SpoolPart` over the same core, so a call site names the
question it asks and each facet stays small. A share calls only what its
own class has, never a sibling's: what two modules share is a module-level
function (``ensure_run``, ``insert_metrics``, ``commit_upload``, ...) that
takes the transaction's connection, so each module can be read alone.
"""

from __future__ import annotations

from functools import cached_property

from .core import AUTOCHECKPOINT_PAGES, SpoolCore, SpoolError, SpoolFullError
from .episodes import EpisodeRow
from .facets import (
    SpoolDelivery,
    SpoolHandover,
    SpoolHousekeeping,
    SpoolIntake,
    SpoolReading,
    SpoolSteps,
)
from .ingest import IngestOutcome
from .processes import (
    lease_owner,
    process_alive,
    process_start_token,
    this_producer,
)
from .runs import DamagedRunError, RunRow
from .schema import SCHEMA_VERSION
from .size import RETAKE_RESERVES, WARN_FRACTION
from .steps import MetricsRow, StepUpload
from .tallies import SpoolCounts
from .uploads import UploadRow
from .view_reads import EpisodeFactsRow, EpisodeFilter, ErrorGroup, SeriesPoint
from .views import (
    EPISODE_AXES,
    HISTOGRAMS,
    SORTS,
    STEP_AXIS,
)

__all__ = [
    "AUTOCHECKPOINT_PAGES",
    "EPISODE_AXES",
    "HISTOGRAMS",
    "RETAKE_RESERVES",
    "SCHEMA_VERSION",
    "SORTS",
    "STEP_AXIS",
    "WARN_FRACTION",
    "DamagedRunError",
    "EpisodeFactsRow",
    "EpisodeFilter",
    "EpisodeRow",
    "ErrorGroup",
    "IngestOutcome",
    "MetricsRow",
    "RunRow",
    "SeriesPoint",
    "Spool",
    "SpoolCounts",
    "SpoolDelivery",
    "SpoolError",
    "SpoolFullError",
    "SpoolHandover",
    "SpoolHousekeeping",
    "SpoolIntake",
    "SpoolReading",
    "SpoolSteps",
    "StepUpload",
    "UploadRow",
    "lease_owner",
    "process_alive",
    "process_start_token",
    "this_producer",
]


class Spool(SpoolCore):
    """Every run, episode and upload of one spool file, by facet (see above).

    Thread-safe (a connection per thread) and process-safe (SQLite locking).
    Each facet is made on first use and holds nothing but this core, so a
    spool opened read-only (:meth:`open_read_only`) has them too.
    """

    @cached_property
    def intake(self) -> SpoolIntake:
        return SpoolIntake(self)

    @cached_property
    def delivery(self) -> SpoolDelivery:
        return SpoolDelivery(self)

    @cached_property
    def steps(self) -> SpoolSteps:
        return SpoolSteps(self)

    @cached_property
    def handover(self) -> SpoolHandover:
        return SpoolHandover(self)

    @cached_property
    def reading(self) -> SpoolReading:
        return SpoolReading(self)

    @cached_property
    def housekeeping(self) -> SpoolHousekeeping:
        return SpoolHousekeeping(self)
