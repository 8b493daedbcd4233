"""The spool's facets: one class per kind of question its callers ask, each
made of the table modules' shares of it (``SpoolPart`` subclasses) over the
one core of the file.

- :class:`SpoolIntake`: what producers write (``export()``, ``serve``, a
  run's end).
- :class:`SpoolDelivery`: what the uploader (and ``push``) asks and records
  of runs, episodes and uploads, and the delivery lease.
- :class:`SpoolSteps`: the same for a training run's step metrics and
  sample tables.
- :class:`SpoolHandover`: what a fleet member asks of a run whose delivery
  changes hands (``handover.py``).
- :class:`SpoolReading`: what the store commands and the viewer read; the
  viewer reads through this facet alone.
- :class:`SpoolHousekeeping`: removing runs and kept bodies, the size cap
  and the disk's reserve, giving space back, counts for watching.
"""

from __future__ import annotations

from .episodes import EpisodeBodies, EpisodeDelivery, EpisodeReads
from .handover import SpoolHandover
from .ingest import SpoolIngest
from .processes import ProcessDelivery, ProcessReads
from .runs import RunDelivery, RunEnds, RunReads, RunRemoval
from .samples import SpoolSamples
from .size import SpoolSize
from .space import SpoolSpace
from .steps import StepDelivery, StepReads
from .tallies import SpoolTallies
from .traces import SpoolTraces
from .uploads import SpoolUploads
from .view_reads import SpoolViews

__all__ = [
    "SpoolDelivery",
    "SpoolHandover",
    "SpoolHousekeeping",
    "SpoolIntake",
    "SpoolReading",
    "SpoolSteps",
]


class SpoolIntake(SpoolIngest, RunEnds):
    """What producers write: batches of episodes and run events, and what a
    run's producer records of it beside them."""


class SpoolDelivery(
    RunDelivery, EpisodeDelivery, SpoolUploads, SpoolTraces, SpoolSamples, ProcessDelivery
):
    """What the uploader asks of a run's episodes and uploads, and records of them."""


class SpoolSteps(StepDelivery):
    """What a training run's uploader asks and records of its steps."""


class SpoolReading(RunReads, EpisodeReads, SpoolViews, StepReads, ProcessReads):
    """What is stored, as the store commands and the viewer read it."""


class SpoolHousekeeping(RunRemoval, EpisodeBodies, SpoolSize, SpoolSpace, SpoolTallies):
    """Keeping the store in shape: removal, the cap and the disk, counts."""
