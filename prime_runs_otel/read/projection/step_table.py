"""The legacy training sample table: one Parquet object of a training step's
episodes, the v0 projection plus the columns only training has, as prime-rl
writes it for its viewer. pyarrow is optional (the ``train`` extra), so it is
imported only when a table is written.
"""

from __future__ import annotations

import importlib
import io
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ...errors import ConfigError
from .episode import rollout_key, summary_trace_index
from .samples import episode_sample_rows
from .strict_json import finite

__all__ = [
    "STEP_TABLE_INTERVAL",
    "ParquetUnavailableError",
    "parquet_available",
    "require_parquet",
    "step_table_parquet",
    "step_table_rows",
    "unnamed_step_table",
    "with_run_id",
]

#: prime-rl's cadence, which prime-runs keeps: every 10th step's episodes go to the
#: legacy step table, the others reach Prime Traces only.
STEP_TABLE_INTERVAL = 10


class ParquetUnavailableError(ConfigError):
    """The legacy training sample table needs pyarrow, which is not installed."""


def parquet_available() -> bool:
    """Whether the optional ``train`` extra (pyarrow) is installed."""
    try:
        importlib.import_module("pyarrow")
    except ImportError:
        return False
    return True


def require_parquet() -> None:
    """Raise :class:`ParquetUnavailableError` saying how to install it."""
    if not parquet_available():
        raise ParquetUnavailableError(
            "the legacy training sample table is written as Parquet, which needs pyarrow: "
            "pip install -e '.[train]' from the clone (or keep Prime Traces on: it needs nothing "
            "extra)"
        )


def _step_table_schema() -> Any:
    pa: Any = importlib.import_module("pyarrow")
    return pa.schema(
        [
            ("run_id", pa.string()),
            ("step", pa.int64()),
            ("tag", pa.string()),
            ("problem_id", pa.int64()),
            ("sample_id", pa.int64()),
            ("prompt", pa.string()),
            ("completion", pa.string()),
            ("trajectory", pa.string()),
            ("answer", pa.string()),
            ("env_name", pa.string()),
            ("task", pa.string()),
            ("info", pa.string()),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("metrics", pa.string()),
            ("timing", pa.string()),
            ("num_input_tokens", pa.int64()),
            ("num_output_tokens", pa.int64()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    )


def _json_column(value: Any) -> str:
    """A JSON text column, spelled as prime-rl's viewer has always read it (the
    standard library's default separators, ASCII only), NaN and infinity as
    ``null``. The encoder's refusal of a non-finite number is the detector,
    as in ``strict_json.encode_finite``: a clean value (the common case) is
    encoded once and never walked, where walking every value first cost more
    than its encoding (``info`` holds the whole record)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(finite(value), allow_nan=False)


def step_table_rows(
    records: Sequence[Mapping[str, Any]],
    run_id: str,
    step: int,
    *,
    sample_id_offset: int = 0,
    created_at: datetime | None = None,
) -> list[dict[str, Any]]:
    """One training step's episodes as rows of the training viewer's table: the v0
    projection plus the columns only training has (advantage, step, problem id).

    As prime-runs numbers them: rollouts per example counted within this call,
    ``sample_id`` running from ``sample_id_offset`` over every sample (a sample without
    a trajectory has no row but keeps its number), so the viewer can look samples up by
    ``(step, sample_id)`` across several objects of one step.
    """
    stamp = created_at or datetime.now(timezone.utc)
    samples: list[tuple[Mapping[str, Any], dict[str, Any]]] = []
    counts: dict[str, int] = {}
    for record in records:
        traces = record.get("traces") or ()
        if not traces:
            continue
        key = json.dumps(rollout_key(record), sort_keys=True, default=str)
        counts[key] = number = counts.get(key, 0) + 1
        samples.extend((record, row) for row in episode_sample_rows(record, number))
    rows: list[dict[str, Any]] = []
    for sample_id, (record, sample) in enumerate(samples, start=sample_id_offset):
        if not sample["trajectory"]:
            continue
        rows.append(_step_row(record, sample, run_id, step, sample_id, stamp))
    return rows


def _step_row(
    record: Mapping[str, Any],
    sample: Mapping[str, Any],
    run_id: str,
    step: int,
    sample_id: int,
    created_at: datetime,
) -> dict[str, Any]:
    traces = record.get("traces") or ()
    summary = traces[summary_trace_index(record)]
    advantage = (summary.get("info") or {}).get("advantage")
    trajectory = [{**branch, "advantage": advantage} for branch in sample["trajectory"]]
    example_id = sample["example_id"]
    try:
        problem_id = int(example_id) if example_id is not None else sample_id
    except (TypeError, ValueError):
        problem_id = sample_id
    return {
        "run_id": run_id,
        "step": step,
        "tag": "",
        "problem_id": problem_id,
        "sample_id": sample_id,
        "prompt": "",
        "completion": _json_column(sample["completion"]),
        "trajectory": _json_column(trajectory),
        "answer": "",
        "env_name": str((record.get("env") or {}).get("id") or ""),
        "task": _json_column(sample["task"]),
        "info": _json_column(sample["info"]),
        "reward": sample["reward"],
        "advantage": advantage,
        "metrics": _json_column(sample["metrics"]),
        "timing": _json_column(sample["timing"]),
        "num_input_tokens": trajectory[-1]["num_input_tokens"],
        "num_output_tokens": trajectory[-1]["num_output_tokens"],
        "created_at": created_at,
    }


def step_table_parquet(
    records: Sequence[Mapping[str, Any]],
    run_id: str,
    step: int,
    *,
    sample_id_offset: int = 0,
    created_at: datetime | None = None,
) -> bytes | None:
    """:func:`step_table_rows` as one Parquet object (snappy, dictionary encoded, with
    statistics, as prime-rl writes it); ``None`` when no episode has a trajectory.

    Raises :class:`ParquetUnavailableError` without pyarrow.
    """
    require_parquet()
    # Imported as untyped modules: pyarrow ships no type information.
    pa: Any = importlib.import_module("pyarrow")
    pq: Any = importlib.import_module("pyarrow.parquet")
    rows = step_table_rows(
        records, run_id, step, sample_id_offset=sample_id_offset, created_at=created_at
    )
    if not rows:
        return None
    table = pa.Table.from_pylist(rows, schema=_step_table_schema())
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="snappy", use_dictionary=True, write_statistics=True)
    return buffer.getvalue()


def with_run_id(body: bytes, run_id: str) -> bytes:
    """A sample-table object written before the platform named its run (its
    ``run_id`` column empty, see ``prime.run.samples``) with ``run_id`` filled
    in and written again as :func:`step_table_parquet` writes; any other
    object as it is. The same bytes for the same input, so a restart sends
    the same object."""
    require_parquet()
    pa: Any = importlib.import_module("pyarrow")
    pq: Any = importlib.import_module("pyarrow.parquet")
    if "run_id" not in pq.read_schema(io.BytesIO(body)).names:
        return body
    # ParquetFile rather than read_table: the same table, without importing
    # pyarrow.dataset (about 40 ms of CPU the first time, in every process
    # that delivers a sample table).
    ids = _read_parquet(pq, body, columns=["run_id"]).column("run_id").to_pylist()
    if any(value not in (None, "") for value in ids):
        return body
    table = _read_parquet(pq, body)
    index = table.column_names.index("run_id")
    column = pa.array([run_id] * table.num_rows, type=table.schema.field(index).type)
    named = table.set_column(index, table.schema.field(index), column)
    buffer = io.BytesIO()
    pq.write_table(named, buffer, compression="snappy", use_dictionary=True, write_statistics=True)
    return buffer.getvalue()


def _read_parquet(pq: Any, body: bytes, columns: list[str] | None = None) -> Any:
    """The table in ``body``, read on the calling thread. A read with
    threads leaves pyarrow's thread pool running, and pyarrow (23 and 24)
    then aborts the process in its own teardown at exit in most runs
    ("terminate called without an active exception", exit code 134) after
    all its work is done. A sample table is a few rows: one thread is
    enough."""
    return pq.ParquetFile(io.BytesIO(body)).read(columns=columns, use_threads=False)


def unnamed_step_table(body: bytes) -> int:
    """The row count of a sample-table object a producer sent (``run_id``
    column present and empty), or raises ``ValueError`` saying what is wrong
    with it: it is outside input until read so."""
    require_parquet()
    pq: Any = importlib.import_module("pyarrow.parquet")
    try:
        parquet = pq.ParquetFile(io.BytesIO(body))
        ids = parquet.read(columns=["run_id"], use_threads=False).column("run_id").to_pylist()
    except Exception as exc:  # pyarrow's errors have no common base of ours
        raise ValueError(f"it is not a Parquet object with a run_id column ({exc})") from exc
    if any(value not in (None, "") for value in ids):
        raise ValueError("its run_id column names a run; the platform's id is filled in later")
    return int(parquet.metadata.num_rows)
