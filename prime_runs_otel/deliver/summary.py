"""A run's summary: the aggregates an eval run is closed with on the platform,
and the ones ``prime-runs-otel show`` prints for any run.

One function for both, so what a user sees locally is what the platform
got: the producer's own summary from its end span when it sent one, else the
running aggregates the spool kept over the episodes it stored, in either case
without the values strict JSON cannot carry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..read.projection import SummaryAccumulator
from .spool import RunRow


def finite_only(values: Mapping[str, Any]) -> dict[str, Any]:
    """Summaries without NaN/inf (strict JSON rejects them); empty nested
    mappings are dropped too, as the platform shows them as nothing."""
    cleaned: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if isinstance(value, Mapping):
            value = finite_only(value)
            if not value:
                continue
        cleaned[key] = value
    return cleaned


def run_summary(run: RunRow) -> dict[str, Any]:
    if run.end_summary is not None:
        summary = finite_only(run.end_summary)
    else:
        summary = finite_only(SummaryAccumulator.from_state(run.summary_state).summary())
    if run.kind == "eval" and run.mode == "online":
        given = summary.get("prime_runs")
        summary["prime_runs"] = {
            **(given if isinstance(given, Mapping) else {}),
            "traces_episodes_written": run.traces_written,
        }
    return summary
