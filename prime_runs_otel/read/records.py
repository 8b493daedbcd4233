"""What a span means to a run, as typed values: the run's identity, its start,
end and step metrics, and an episode span whose record is still to be
synthesised; and :class:`RunBatch`, what one export brings for one run.

:mod:`~prime_runs_otel.read.checks` returns these once it has checked a span,
and the steps after it (grouping by run, the spool, the uploader) read them
instead of the span's attributes: a value is checked where it comes in, once,
and read as checked everywhere after. An episode's own two outcomes are in
:mod:`~prime_runs_otel.read.episodes`, below the span view that carries them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import RecordError
from .episodes import CorruptEpisode, EpisodeArrival

if TYPE_CHECKING:
    # Only named in annotations: the spans' module imports the OpenTelemetry
    # SDK, which the spool (and so every store command) reads runs without.
    from .spans import SpanView

__all__ = [
    "CorruptMetrics",
    "RunBatch",
    "RunEnd",
    "RunIdentity",
    "RunMetrics",
    "RunSamples",
    "RunStart",
    "SpanMeaning",
    "UnrecordedEpisode",
]


@dataclass(frozen=True)
class RunIdentity:
    """A run as its producer named it on the Resource.

    ``local_id`` is the producer's key, not the platform's id: the consumer
    maps one to the other once the run exists.
    """

    local_id: str
    kind: str = "eval"
    name: str | None = None
    model: str | None = None
    environments: tuple[str, ...] = ()
    framework: str | None = None
    tags: tuple[str, ...] = ()
    description: str | None = None
    attach: str | None = None
    team_id: str | None = None
    #: Training runs only: what the run is registered with.
    max_steps: int | None = None
    batch_size: int | None = None
    rollouts_per_example: int | None = None
    seq_len: int | None = None
    wandb_project: str | None = None
    wandb_entity: str | None = None
    wandb_run_name: str | None = None

    def to_json(self) -> str:
        """Stable JSON for the spool, where the identity outlives the process."""
        return json.dumps(asdict(self), sort_keys=True, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> RunIdentity:
        """Inverse of :meth:`to_json`."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("local_id"), str):
            raise RecordError(
                "a stored run identity needs a 'local_id'; the spool entry is damaged"
            )
        data["environments"] = tuple(data.get("environments") or ())
        data["tags"] = tuple(data.get("tags") or ())
        known = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
        return cls(**known)


@dataclass(frozen=True)
class RunStart:
    """The run config, sent once.

    ``corrupt_reason`` is set (and ``config`` empty) when the config arrived
    damaged: the run can still be created, and the loss is visible rather
    than the config silently missing.
    """

    config: dict[str, Any]
    corrupt_reason: str | None = None
    #: ``False`` from a process that feeds a run somebody else owns.
    owner: bool = True
    #: Who sent it (``service.instance.id``; ``""`` when the Resource names
    #: nobody, ``None`` when nobody asked, as in process).
    producer: str | None = None


@dataclass(frozen=True)
class RunEnd:
    """The terminal status the producer reported."""

    status: str
    error: str | None
    episodes_recorded: int | None
    #: The producer's own run summary, when it sent one.
    summary: dict[str, Any] | None = None
    episodes_unencodable: int = 0
    #: Who sent it (see :attr:`RunStart.producer`): ``serve`` applies the end
    #: only when this is the run's owner.
    producer: str | None = None


@dataclass(frozen=True)
class UnrecordedEpisode:
    """An episode span without a record: its record is to be synthesised from
    the spans under it once they are all in (:mod:`prime_runs_otel.read.synthesis`)."""

    episode_id: str
    view: SpanView


@dataclass(frozen=True)
class RunMetrics:
    """One training step's metrics, as ``POST /rft/metrics`` takes them.

    Two forms, as the source chose (``prime.run.metrics.verbatim``): a step
    row of this package (merged with the step's other rows, ``step`` and
    ``_timestamp`` added), or a row posted exactly as logged (``verbatim``:
    ``values`` is the whole row, ``step`` inside it as the producer wrote
    it), a post of its own that ``key`` (its span's ids) names, so that a
    copy of the span is stored once.
    """

    step: int
    values: dict[str, Any]
    timestamp: float
    verbatim: bool = False
    key: str = ""

    def row(self) -> dict[str, Any]:
        """The platform row: the values plus ``step`` and ``_timestamp``, or
        a verbatim row's values as they are."""
        if self.verbatim:
            return dict(self.values)
        return {**self.values, "step": self.step, "_timestamp": self.timestamp}


@dataclass(frozen=True)
class RunSamples:
    """One Parquet object of a training step's sample table, as its producer
    wrote it (``run_id`` column empty until it is sent); ``key`` (its span's
    ids) stores a copy of the span once."""

    step: int
    body: bytes
    key: str


@dataclass(frozen=True)
class CorruptMetrics:
    """A metrics span whose values cannot be trusted: to be counted and logged."""

    step: int | None
    reason: str


SpanMeaning = (
    RunStart
    | RunEnd
    | EpisodeArrival
    | CorruptEpisode
    | UnrecordedEpisode
    | RunMetrics
    | CorruptMetrics
    | RunSamples
)


@dataclass
class RunBatch:
    """What one export call brings for one run, in arrival order."""

    identity: RunIdentity
    start: RunStart | None = None
    episodes: list[EpisodeArrival] = field(default_factory=list)
    end: RunEnd | None = None
    corrupt: list[CorruptEpisode] = field(default_factory=list)
    metrics: list[RunMetrics] = field(default_factory=list)
    corrupt_metrics: list[CorruptMetrics] = field(default_factory=list)
    samples: list[RunSamples] = field(default_factory=list)
