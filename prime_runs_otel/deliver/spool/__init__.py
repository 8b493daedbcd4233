"""The spool: a SQLite file that holds every run, episode and upload until the
platform has acknowledged it, and that doubles as the local store.

One module per question:

- ``core``: connections, transactions, the fork gate; ``schema``: the tables
  and the migrations of a spool written by an earlier release.
- ``runs``: one row per producer run key, its lifecycle and running summary.
- ``episodes``: one row per (run, episode id) and its record body.
- ``ingest``: ``export()``'s one-transaction write of a whole batch.
- ``uploads``: the open uploads of a run, of any kind; ``traces``: Prime
  Traces uploads (exactly once); ``samples``: legacy sample requests (at most
  once); ``steps``: training step metrics and sample-table objects.
- ``processes``: which processes feed a run, and the delivery lease.
- ``size``: the size cap, and the room kept on the spool's disk for
  delivery; ``tallies``: counts over the whole spool, for watching it
  (``serve``'s /metrics).
- ``space``: giving the file's free pages back to the disk (``rm``,
  ``prune``, ``compact``).
- ``views``: what the local viewer and ``show`` read of a run (its episodes'
  facts, distributions, errors, series, per-example rewards), kept up to
  date by ``ingest``; ``rows``: the multi-row statements both use.

Composition: :class:`Spool` is the core with one mixin per module above, each
a subclass of :class:`~.core.SpoolCore`, so every module reaches the same
connections and transactions and every caller keeps calling ``spool.x(...)``.
Sub-objects (``spool.runs.get(...)``) would name the table at each call site,
but would change every caller of the spool for no change in behaviour; the
mixins keep the split inside this package. A mixin calls only what it
inherits (the core; ``ingest`` also the size cap it enforces), never a
sibling: what two modules share is a module-level function (``ensure_run``,
``insert_metrics``, ``commit_upload``, ...) that takes the transaction's
connection, so each module can be read alone.
"""

from __future__ import annotations

from .core import AUTOCHECKPOINT_PAGES, SpoolError, SpoolFullError
from .episodes import EpisodeRow, SpoolEpisodes
from .handover import SpoolHandover
from .ingest import IngestOutcome, SpoolIngest
from .processes import (
    SpoolProcesses,
    lease_owner,
    process_alive,
    process_start_token,
    this_producer,
)
from .runs import DamagedRunError, RunRow, SpoolRuns
from .samples import SpoolSamples
from .schema import SCHEMA_VERSION
from .size import RETAKE_RESERVES, WARN_FRACTION
from .space import SpoolSpace
from .steps import MetricsRow, SpoolSteps, StepUpload
from .tallies import SpoolCounts, SpoolTallies
from .traces import SpoolTraces
from .uploads import SpoolUploads, UploadRow
from .views import (
    EPISODE_AXES,
    HISTOGRAMS,
    SORTS,
    STEP_AXIS,
    EpisodeFactsRow,
    EpisodeFilter,
    ErrorGroup,
    SeriesPoint,
    SpoolViews,
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
    "SpoolError",
    "SpoolFullError",
    "StepUpload",
    "UploadRow",
    "lease_owner",
    "process_alive",
    "process_start_token",
    "this_producer",
]


class Spool(
    SpoolIngest,
    SpoolRuns,
    SpoolEpisodes,
    SpoolUploads,
    SpoolTraces,
    SpoolSamples,
    SpoolSteps,
    SpoolProcesses,
    SpoolViews,
    SpoolTallies,
    SpoolSpace,
    SpoolHandover,
):
    """Every run, episode and upload of one spool file (see the modules above).

    Thread-safe (a connection per thread) and process-safe (SQLite locking).
    """
