"""A training run's steps as ``show`` and ``runs`` print them: how many
steps were logged, the last one, and its loss and reward, next to where
they started. Read from the step metrics rows the run logged
(``run.log_metrics(..., step=...)``), as the platform receives them."""

from __future__ import annotations

import json
import math
from typing import Any

from ...deliver.spool import RunRow, Spool

#: Keys of a metrics row that are its bookkeeping, not a metric.
_BOOKKEEPING = frozenset({"step", "_timestamp"})


def training_view(spool: Spool, run: RunRow) -> dict[str, Any] | None:
    """``None`` for an eval; for a training run, its steps (``--json``'s
    ``training`` key, documented in docs/cli.md)."""
    if run.kind != "train":
        return None
    steps = [(row.step, _metrics(row.row)) for row in spool.reading.metrics_rows(run.local_id)]
    view: dict[str, Any] = {"steps": len(steps), "last_step": None, "loss": None, "reward": None}
    if not steps:
        return view
    first_step, first = steps[0]
    last_step, last = steps[-1]
    view["last_step"] = last_step
    for name in ("loss", "reward"):
        key = _key_for(name, last)
        if key is not None:
            view[name] = {
                "metric": key,
                "value": last[key],
                "first": first.get(key),
                "first_step": first_step,
            }
    view["metrics"] = last
    return view


def with_training(spool: Spool, run: RunRow, view: dict[str, Any]) -> dict[str, Any]:
    """``view`` (a run as ``--json`` prints it) with its ``training`` key."""
    return {**view, "training": training_view(spool, run)}


def training_lines(view: dict[str, Any]) -> list[tuple[str, str]]:
    """``show``'s lines for a training run: (label, text)."""
    if not view["steps"]:
        return [("steps", "none logged yet (run.log_metrics(..., step=...))")]
    lines = [("steps", f"{view['steps']} logged, last step {view['last_step']}")]
    for name in ("loss", "reward"):
        item = view[name]
        if item is None:
            continue
        text = f"{item['value']:.4g} at step {view['last_step']}"
        if item["first"] is not None and view["steps"] > 1:
            text += f", from {item['first']:.4g} at step {item['first_step']}"
        if item["metric"] != name:
            text += f" ({item['metric']})"
        lines.append(("loss" if name == "loss" else "step reward", text))
    return lines


def step_column(view: dict[str, Any] | None) -> str:
    """``runs``' STEP column: the last step of a training run, ``-`` else."""
    if view is None or view["last_step"] is None:
        return "-"
    return str(view["last_step"])


def _metrics(text: str) -> dict[str, float]:
    """The numbers of one metrics row (its bookkeeping left out)."""
    try:
        row = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(row, dict):
        return {}
    return {
        str(key): float(value)
        for key, value in row.items()
        if key not in _BOOKKEEPING
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def _key_for(name: str, metrics: dict[str, float]) -> str | None:
    """The metric that is the run's ``name`` (loss, reward): the key itself,
    else the first whose last part is it (``train/loss``), else the first
    that starts with it (``reward/mean``)."""
    if name in metrics:
        return name
    for key in sorted(metrics):
        if key.rsplit("/", 1)[-1] == name:
            return key
    for key in sorted(metrics):
        if key.startswith(name):
            return key
    return None
