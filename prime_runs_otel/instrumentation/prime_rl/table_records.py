"""The records of the rollouts a step's sample table will take, converted
once for both of their uses.

Every rollout becomes an episode (its record, from verifiers'
``Episode.to_record()``), and the ``effective`` train cohort of every 10th
step becomes that step's sample table, made from the same records. Each
conversion is a pydantic dump with verifiers' computed token counts, about
half a millisecond for a rollout of 8 KB, and was paid twice for the
rollouts of a table step: once for the episode, once for the table. Here
the rollouts of a table step are converted on the recorder's thread, the
record handed to the run in place of the ``Episode`` and kept for the table.

Only table steps are kept, on the recorder's thread alone (it records the
rollouts and writes the tables, in order), and a step's records go once its
table is written, or once a later table step's rollouts arrive (a table
that never comes: a step without train rollouts, or an ``effective``
cohort prime-rl did not log).
"""

from __future__ import annotations

from typing import Any

from ...read.projection import STEP_TABLE_INTERVAL
from .rows import plain_record, record_of

__all__ = ["TableRecords"]


class TableRecords:
    """Rollouts of table steps and their records, by step and by the
    rollout's identity (the ``effective`` cohort is made of the very objects
    logged in ``all``)."""

    def __init__(self) -> None:
        self._steps: dict[int, dict[int, tuple[Any, dict[str, Any]]]] = {}

    def for_run(self, episode: Any, step: int, kind: str) -> Any:
        """What to hand the run for ``episode``: its record when a table
        will want it too (kept for it), else the episode itself, which the
        run converts on its own thread as for any other caller."""
        if kind != "train" or step % STEP_TABLE_INTERVAL != 0:
            return episode
        to_record = getattr(episode, "to_record", None)
        if not callable(to_record):
            return episode
        try:
            record = to_record()
        except Exception:
            return episode  # the run refuses it and counts it, as before
        if not (isinstance(record, dict) and isinstance(record.get("traces"), list)):
            return episode  # not a record the run takes: it says so, as before
        kept = self._steps.get(step)
        if kept is None:
            for older in [known for known in self._steps if known < step]:
                del self._steps[older]
            kept = self._steps[step] = {}
        kept[id(episode)] = (episode, record)
        return record

    def table_records(self, episodes: list[Any], step: int) -> list[Any]:
        """The plain records of ``episodes`` for the step's table, in their
        order (a rollout not kept is converted now), and in place of each
        rollout that has none the exception saying why; the step's kept
        records are let go."""
        kept = self._steps.pop(step, {})
        records: list[Any] = []
        for episode in episodes:
            known = kept.get(id(episode))
            try:
                if known is not None and known[0] is episode:
                    records.append(plain_record(known[1]))
                else:
                    records.append(record_of(episode))
            except Exception as exc:
                records.append(exc)
        return records
