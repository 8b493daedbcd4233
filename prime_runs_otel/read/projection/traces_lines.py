"""Prime Traces episode lines: the record keyed to its platform run, one
strict-JSON line, the same bytes every time (the upload id is their digest);
and :class:`LineTemplate`, the line made before the platform has named the
run, so the uploader need not parse the stored record again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..._json import dumps_strict
from .strict_json import encode_finite

__all__ = [
    "RUN_ID_PLACEHOLDER",
    "LineTemplate",
    "stamp_run",
    "traces_line",
    "traces_line_template",
]


def stamp_run(
    record: Mapping[str, Any], run_id: str, run_type: str, *, step: int | None = None
) -> dict[str, Any]:
    """A copy keyed to the platform run: ``run.id`` and ``run.type`` on the envelope and
    on every member trace, the rest of each run block (``name``, ``work``) kept.

    Members matter because the traces service reads the run from ``trace.run.id`` only,
    while verifiers records the run on the episode; a member without its own run block
    inherits the envelope's. Only the envelope, the run blocks and the trace list are
    copied.

    ``step`` fills in the training work (``work: {type: train, step}``) of a training
    episode whose record does not say it, as a record synthesised from another
    instrumentation's spans does not: a training run's episode names its step.
    """
    stamped = dict(record)
    envelope_run = _rekeyed(stamped.get("run"), run_id, run_type)
    if run_type == "train" and step is not None and "work" not in envelope_run:
        envelope_run["work"] = {"type": "train", "step": step}
    stamped["run"] = envelope_run
    members = stamped.get("traces")
    if isinstance(members, list):
        stamped["traces"] = [
            {**member, "run": _rekeyed(member.get("run") or envelope_run, run_id, run_type)}
            if isinstance(member, Mapping)
            else member
            for member in members
        ]
    return stamped


def _rekeyed(run: Any, run_id: str, run_type: str) -> dict[str, Any]:
    keyed = dict(run) if isinstance(run, Mapping) else {}
    keyed["id"] = run_id
    keyed["type"] = run_type
    return keyed


def traces_line(
    record: Mapping[str, Any], run_id: str, run_type: str, *, step: int | None = None
) -> bytes:
    """One Prime Traces episode line: the stamped record as compact UTF-8 JSON plus a
    newline, NaN and infinity as ``null``. Strict JSON because the service rejects the
    JavaScript literals, and the same bytes every time because the upload id is their
    digest."""
    stamped = stamp_run(record, run_id, run_type, step=step)
    encoded = dumps_strict(stamped)
    if encoded is None:
        _, encoded = encode_finite(stamped)
    return encoded + b"\n"


#: What a line template holds where the platform's run id goes: a string no
#: honest record holds whole (a template whose record does hold it is not made).
RUN_ID_PLACEHOLDER = "\x00prime-run-id\x00"
_PLACEHOLDER_JSON = b'"\\u0000prime-run-id\\u0000"'


@dataclass(frozen=True, slots=True)
class LineTemplate:
    """An episode's Prime Traces line before the platform has named its run:
    :func:`traces_line` for ``run_type`` and ``step``, with
    :data:`RUN_ID_PLACEHOLDER` for the run id."""

    run_type: str
    step: int | None
    data: bytes

    def fill(self, run_id: str, run_type: str, step: int | None) -> bytes | None:
        """The line :func:`traces_line` makes for this run, or ``None`` when
        the template was made for another run type or step (the caller then
        makes the line itself)."""
        if run_type != self.run_type or step != self.step:
            return None
        return self.data.replace(
            _PLACEHOLDER_JSON, dumps_strict(run_id) or json.dumps(run_id).encode()
        )


def traces_line_template(
    record: Mapping[str, Any], run_type: str, *, step: int | None = None
) -> LineTemplate | None:
    """The record's :class:`LineTemplate`; ``None`` when the record holds the
    placeholder itself, or needs the slow encoder.

    Whoever reads a record parsed (the producer handing it over in process,
    ``serve`` reading it off a span) builds its line there, and spares the
    uploader parsing the stored record a second time.
    """
    members = record.get("traces")
    runs = 1 + (sum(isinstance(m, Mapping) for m in members) if isinstance(members, list) else 0)
    stamped = stamp_run(record, RUN_ID_PLACEHOLDER, run_type, step=step)
    encoded = dumps_strict(stamped)
    if encoded is None or encoded.count(_PLACEHOLDER_JSON) != runs:
        return None
    return LineTemplate(run_type, step, encoded + b"\n")
