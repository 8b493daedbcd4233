"""An episode as the spool takes it, or why it cannot be taken.

Two readers produce these: the producer in this process, which reads the
record it hands to its own exporter (``SpanView.prepared``), and the readers
of the span contract, which read it off the episode span. The span view must
name them and the readers must name the span view, so the two types live
here, below both, and neither of those modules imports the other.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._json import loads as fast_loads
from .projection.summary import EpisodeDigest, digest_episode
from .projection.traces_lines import LineTemplate, traces_line_template

__all__ = ["CorruptEpisode", "EpisodeArrival", "episode_arrival"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeArrival:
    """A verified episode record.

    ``raw`` is the exact UTF-8 JSON the producer serialised, so uploads can
    reuse those bytes (and their digest) instead of serialising again.
    ``digest`` is what the spool needs of the parsed record; the parsed
    record itself is not kept (see :class:`EpisodeDigest`). ``step`` is the
    training step the episode is *training work* of (see
    :func:`~prime_runs_otel.read.checks.record_step`); ``None`` for eval work
    and for eval runs. ``line`` is the record's Prime Traces line with a
    placeholder for the platform's run id, when whoever read the record built
    it (:func:`~prime_runs_otel.read.projection.traces_lines.traces_line_template`).
    """

    episode_id: str
    raw: bytes
    digest: EpisodeDigest
    step: int | None = None
    line: LineTemplate | None = None

    @classmethod
    def of(cls, record: Mapping[str, Any], raw: bytes, step: int | None = None) -> EpisodeArrival:
        """The arrival of ``record`` (serialised as ``raw``); ``ValueError`` when
        it is not in the verifiers shape (see :func:`digest_episode`)."""
        return cls(str(record["id"]), raw, digest_episode(record), step)

    @property
    def record(self) -> dict[str, Any]:
        """The record, parsed again from ``raw`` (a fresh copy on every call)."""
        record: dict[str, Any] = fast_loads(self.raw)
        return record


@dataclass(frozen=True)
class CorruptEpisode:
    """An episode span whose record cannot be trusted: to be counted and logged."""

    episode_id: str | None
    reason: str


def episode_arrival(
    record: Mapping[str, Any],
    raw: bytes,
    episode_id: str,
    step: int | None,
    *,
    line_for: str | None = None,
) -> EpisodeArrival | CorruptEpisode:
    """A checked record (see :func:`~prime_runs_otel.read.checks.read_record`)
    as the spool takes it: digested, and with its Prime Traces line template
    when ``line_for`` names the type of a run that will upload it; or why the
    spool cannot take it."""
    try:
        digest = digest_episode(record)
    except ValueError as exc:
        return CorruptEpisode(episode_id, f"the episode record is damaged: {exc}")
    line = None
    if line_for is not None:
        try:
            line = traces_line_template(record, line_for, step=step)
        except Exception:  # only a shortcut: the uploader makes the line itself
            logger.debug("no Prime Traces line template for episode %s", episode_id, exc_info=True)
    return EpisodeArrival(episode_id, raw, digest, step, line)
