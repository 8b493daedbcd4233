"""Platform records projected from episode records alone.

An episode record is the JSON document verifiers' ``Episode.to_record()`` produces. The
platform wants three things derived from it: the legacy v0 sample row, the Prime Traces
episode line, and the run summary. prime-runs computes the first and the last from
verifiers *objects*; here they are computed from the record, so the exporter never
imports verifiers and never pays for validating an episode it only forwards. The
results must be the ones prime-runs would send for the same episode, byte for byte,
because the dashboard cannot tell the two producers apart and must not have to.

Records are taken as canonical (what ``to_record()`` emits: defaults present, ``None``
fields absent). Rows share unchanged sub-objects with the record instead of copying
them, so treat both as read-only once projected.
"""

from __future__ import annotations

import importlib
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .._json import dumps_strict
from ..errors import ConfigError

__all__ = [
    "MAX_SAMPLES_PAYLOAD_BYTES",
    "STEP_TABLE_INTERVAL",
    "EpisodeDigest",
    "LineTemplate",
    "ParquetUnavailableError",
    "SampleTooLargeError",
    "SummaryAccumulator",
    "TraceScores",
    "batch_sample_rows",
    "digest_episode",
    "encode_sample_batches",
    "encode_samples_body",
    "episode_sample_rows",
    "parquet_available",
    "require_parquet",
    "rollout_key",
    "stamp_run",
    "step_table_parquet",
    "step_table_rows",
    "summary_trace_index",
    "traces_line",
    "traces_line_template",
]

#: The platform's ceiling on one ``POST /evaluations/{id}/samples`` request body.
MAX_SAMPLES_PAYLOAD_BYTES = 25 * 1024 * 1024
_ENVELOPE_BYTES = len(b'{"samples":[]}')
#: Stop conditions verifiers counts as hitting a framework limit (``Trace.is_truncated``).
_TRUNCATING_STOPS = frozenset(
    {
        "max_turns",
        "max_input_tokens",
        "max_output_tokens",
        "max_total_tokens",
        "compaction_failed",
    }
)

Number = int | float


class SampleTooLargeError(ValueError):
    """A sample row exceeds the request ceiling on its own.

    Raised instead of dropping the row: a silently missing rollout skews every average
    on the dashboard, while an error here is counted and reported as a loss.
    """


# --- JSON -------------------------------------------------------------------------------


def _encode(value: Any) -> bytes:
    """Compact UTF-8 JSON, the encoding both the samples API and Prime Traces receive.
    ``allow_nan=False`` makes a non-finite float raise, which callers use as a cheap
    detector instead of walking every record up front."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(
        "utf-8"
    )


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinity replaced by ``None``, the way the platform tables
    show them. Containers are rebuilt only along paths that change, so a clean record
    comes back as the very same object."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        changed = None
        for key, item in value.items():
            cleaned = _finite(item)
            if cleaned is not item:
                if changed is None:
                    changed = dict(value)
                changed[key] = cleaned
        return value if changed is None else changed
    if isinstance(value, list):
        items = [_finite(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, tuple):
        return [_finite(item) for item in value]
    return value


def _encode_finite(value: Any) -> tuple[Any, bytes]:
    """``(value, its JSON)``, with non-finite floats nulled only when there are any."""
    try:
        return value, _encode(value)
    except ValueError:
        cleaned = _finite(value)
        return cleaned, _encode(cleaned)


# --- traces and branches ------------------------------------------------------------------


def summary_trace_index(record: Mapping[str, Any]) -> int:
    """The trace that stands for the episode in flat views: the first trainable one (the
    policy's own rollout), else the first (an all-judge episode still gets a row)."""
    for index, trace in enumerate(record.get("traces") or ()):
        if _trainable(trace):
            return index
    return 0


def rollout_key(record: Mapping[str, Any]) -> Any:
    """The example id rollouts are numbered under: ``task.data.idx`` of the summary
    trace. Meaningful only for an episode with traces; others get no sample row."""
    traces = record.get("traces") or ()
    if not traces:
        return None
    return _task_data(traces[summary_trace_index(record)]).get("idx")


def _trainable(trace: Mapping[str, Any]) -> bool:
    return bool((trace.get("agent") or {}).get("trainable", True))


def _task_data(trace: Mapping[str, Any]) -> Mapping[str, Any]:
    data: Mapping[str, Any] = (trace.get("task") or {}).get("data") or {}
    return data


def _branch_paths(nodes: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """Root-to-leaf node indices, one per leaf in node order: verifiers' branches."""
    parents = {node.get("parent") for node in nodes}
    paths = []
    for leaf in range(len(nodes)):
        if leaf in parents:
            continue
        path = []
        current: int | None = leaf
        while current is not None:
            path.append(current)
            current = nodes[current].get("parent")
        path.reverse()
        paths.append(path)
    return paths


def _input_tokens(usage: Mapping[str, Any]) -> int:
    fed: int = usage["prompt_tokens"] + (usage.get("cached_input_tokens") or 0)
    return fed


def _branch_entry(
    nodes: Sequence[Mapping[str, Any]], path: list[int], calls_by_node: Mapping[int, Any]
) -> dict[str, Any]:
    """One trajectory entry. Input tokens are each call's prompt beyond the previous
    call's whole sequence (never negative), so shared history is not counted again."""
    input_tokens = output_tokens = previous_total = 0
    for index in path:
        call = calls_by_node.get(index)
        usage = call.get("usage") if call is not None else None
        if usage is None:
            continue
        fed = _input_tokens(usage)
        input_tokens += max(0, fed - previous_total)
        output_tokens += usage["completion_tokens"]
        previous_total = fed + usage["completion_tokens"]
    return {
        "messages": [nodes[index]["message"] for index in path],
        "num_input_tokens": input_tokens,
        "num_output_tokens": output_tokens,
    }


def _token_usage(calls: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Usage summed over every call that reported it; an optional counter is present
    when at least one call reported it, so one silent provider does not erase it."""
    usages = [usage for call in calls if (usage := call.get("usage")) is not None]
    if not usages:
        return None
    total: dict[str, Any] = {
        "prompt_tokens": sum(usage["prompt_tokens"] for usage in usages),
        "completion_tokens": sum(usage["completion_tokens"] for usage in usages),
    }
    for name in ("cached_input_tokens", "reasoning_tokens"):
        reported = [usage[name] for usage in usages if usage.get(name) is not None]
        if reported:
            total[name] = sum(reported)
    costs = [float(usage["cost"]) for usage in usages if usage.get("cost") is not None]
    if costs:
        total["cost"] = sum(costs)
    return total


def _is_truncated(trace: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]) -> bool:
    """A framework limit stopped the trace, or its last successful call ran out of length."""
    stop = trace.get("stop_condition")
    if isinstance(stop, str) and stop in _TRUNCATING_STOPS:
        return True
    for call in reversed(calls):
        if call.get("error") is None:
            return call.get("finish_reason") == "length"
    return False


def _weighted_reward(rewards: Mapping[str, Any]) -> Number:
    """Sum of score times weight over the rewards that ran, added in the same order and with
    the same builtin ``sum`` verifiers uses, so the float is identical (0 when none ran)."""
    return sum(
        float(reward["score"]) * float(reward.get("weight", 1.0))
        for reward in rewards.values()
        if reward is not None
    )


# --- sample rows --------------------------------------------------------------------------


def _trace_row(trace: Mapping[str, Any], rollout_number: int, episode_id: Any) -> dict[str, Any]:
    """One trace as a v0 sample row, non-finite values not yet nulled."""
    nodes = trace.get("nodes") or ()
    calls = trace.get("calls") or ()
    calls_by_node = {call["node"]: call for call in calls if call.get("node") is not None}
    trajectory = [_branch_entry(nodes, path, calls_by_node) for path in _branch_paths(nodes)]
    task = _task_data(trace)
    agent = trace.get("agent") or {}
    rewards = trace.get("rewards") or {}
    errors = trace.get("errors") or ()
    metrics = trace.get("metrics") or {}
    row: dict[str, Any] = {
        "sample_id": trace.get("id"),
        "example_id": task.get("idx"),
        "rollout_number": rollout_number,
        "episode_id": episode_id,
        "agent": agent.get("name", "agent"),
        "trainable": agent.get("trainable", True),
        "task": task,
        "prompt": [],
        "completion": trajectory[-1]["messages"] if trajectory else [],
        "answer": task.get("answer"),
        "tool_defs": trace.get("tools") or None,
        "reward": _weighted_reward(rewards),
        "timing": trace.get("timing") or {},
        "is_completed": trace.get("is_completed", False),
        "is_truncated": _is_truncated(trace, calls),
        "metrics": {name: _as_float(value) for name, value in metrics.items()},
        "error": errors[-1] if errors else None,
        "stop_condition": trace.get("stop_condition"),
        "trajectory": trajectory,
        "token_usage": _token_usage(calls),
        "info": dict(trace.get("info") or {}) or None,
    }
    for name, reward in rewards.items():
        if reward is not None:
            row.setdefault(name, float(reward["score"]))
    return row


def _as_float(value: Any) -> Any:
    """Metric values are floats on the verifiers side even when a record spells ``1``."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def episode_sample_rows(record: Mapping[str, Any], rollout_number: int) -> list[dict[str, Any]]:
    """The episode's v0 sample rows, as prime-runs' ``episode_to_samples`` makes them.

    Normally one row: the summary trace's projection keyed by the episode id, carrying
    the whole record in ``info.native_wrapper`` so nothing is lost in the flat table. A
    row over the request ceiling falls back to one projection per trace (without the
    wrapper), which is the most of the episode the table can still hold. No traces, no
    rows: there is nothing to show.
    """
    traces = record.get("traces") or ()
    if not traces:
        return []
    index = summary_trace_index(record)
    episode_id = record.get("id")
    row = _trace_row(traces[index], rollout_number, episode_id)
    row["sample_id"] = episode_id
    row["info"] = {**(row["info"] or {}), "native_wrapper": record, "native_trace_index": index}
    row, encoded = _encode_finite(row)
    if _ENVELOPE_BYTES + len(encoded) <= MAX_SAMPLES_PAYLOAD_BYTES:
        return [row]
    return [_finite(_trace_row(trace, rollout_number, episode_id)) for trace in traces]


def batch_sample_rows(rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows grouped into request bodies under the ceiling, in order.

    Raises :class:`SampleTooLargeError` for a row that cannot be sent even alone.
    """
    encoded = [_encode(row) for row in rows]
    return [list(rows[start:end]) for start, end in _batch_bounds(rows, encoded)]


def encode_sample_batches(rows: Sequence[dict[str, Any]]) -> list[bytes]:
    """The request bodies for ``rows``: ``encode_samples_body`` of each batch
    ``batch_sample_rows`` makes, byte for byte, with every row encoded once instead of
    once to batch and again to send."""
    encoded = [_encode(row) for row in rows]
    return [
        b'{"samples":[' + b",".join(encoded[start:end]) + b"]}"
        for start, end in _batch_bounds(rows, encoded)
    ]


def _batch_bounds(
    rows: Sequence[Mapping[str, Any]], encoded: Sequence[bytes]
) -> list[tuple[int, int]]:
    """Greedy ``[start, end)`` spans of rows whose body stays under the ceiling."""
    spans: list[tuple[int, int]] = []
    start = 0
    body_bytes = _ENVELOPE_BYTES
    for position, row_json in enumerate(encoded):
        row_bytes = len(row_json)
        if _ENVELOPE_BYTES + row_bytes > MAX_SAMPLES_PAYLOAD_BYTES:
            raise SampleTooLargeError(_too_large_message(position, rows[position], row_bytes))
        joined = body_bytes + (1 if position > start else 0) + row_bytes  # 1: the comma
        if position > start and joined > MAX_SAMPLES_PAYLOAD_BYTES:
            spans.append((start, position))
            start, joined = position, _ENVELOPE_BYTES + row_bytes
        body_bytes = joined
    if start < len(encoded):
        spans.append((start, len(encoded)))
    return spans


def _too_large_message(position: int, row: Mapping[str, Any], row_bytes: int) -> str:
    return (
        f"sample row {position} (episode {row.get('episode_id')!r}, sample "
        f"{row.get('sample_id')!r}) is {_ENVELOPE_BYTES + row_bytes} bytes as a request, over "
        f"the platform's {MAX_SAMPLES_PAYLOAD_BYTES}-byte limit for "
        "POST /evaluations/{id}/samples even on its own. Shrink the trace (for example "
        "drop large tool outputs or info fields) or rely on Prime Traces, which accepts "
        "lines up to 64 MiB."
    )


def encode_samples_body(rows: Sequence[dict[str, Any]]) -> bytes:
    """The exact request body ``{"samples": [...]}`` for one batch."""
    return _encode({"samples": list(rows)})


# --- Prime Traces lines -------------------------------------------------------------------


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
        _, encoded = _encode_finite(stamped)
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


# --- the training step table (Parquet) ----------------------------------------------------

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
    standard library's default separators, ASCII only)."""
    return json.dumps(_finite(value), allow_nan=False)


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


# --- run summary --------------------------------------------------------------------------


def _sum_is_compensated() -> bool:
    """Whether this interpreter's builtin ``sum`` compensates float rounding (3.12+).
    prime-runs averages rewards with ``sum``, so the running total must follow it."""
    return sum([1.0, 1e100, 1.0, -1e100]) == 2.0


_COMPENSATED_SUM = _sum_is_compensated()


class _BuiltinSum:
    """The builtin ``sum`` of a sequence, computed one item at a time.

    Reproduces CPython's arithmetic exactly: integers add exactly until the first float,
    then floats add left to right, with Neumaier compensation on interpreters whose
    ``sum`` has it. The result is therefore bit-identical to ``sum`` over all items at
    once, which an averaged-at-the-end total would not be.
    """

    __slots__ = ("compensation", "total")

    def __init__(self, total: Number = 0, compensation: float = 0.0) -> None:
        self.total = total
        self.compensation = compensation

    def add(self, value: Number) -> None:
        total = self.total
        if isinstance(total, int) or not _COMPENSATED_SUM:
            self.total = total + value
        elif isinstance(value, float):
            added = total + value
            if abs(total) >= abs(value):
                self.compensation += (total - added) + value
            else:
                self.compensation += (value - added) + total
            self.total = added
        else:
            self.total = total + float(value)

    def result(self) -> Number:
        total, compensation = self.total, self.compensation
        if isinstance(total, float) and compensation and math.isfinite(compensation):
            return total + compensation
        return total


@dataclass(frozen=True, slots=True)
class TraceScores:
    """One trace's share of the run summary: whether it is trainable, its weighted
    reward and its per-name scores and metrics (a metric overriding a score of the
    same name, as verifiers merges them)."""

    trainable: bool
    reward: Number
    values: tuple[tuple[str, float], ...]

    @classmethod
    def of(cls, trace: Mapping[str, Any]) -> TraceScores:
        rewards = trace.get("rewards") or {}
        values = {
            name: float(reward["score"]) for name, reward in rewards.items() if reward is not None
        }
        for name, value in (trace.get("metrics") or {}).items():
            if value is not None:
                values[name] = float(value)
        return cls(_trainable(trace), _weighted_reward(rewards), tuple(values.items()))


@dataclass(frozen=True, slots=True)
class EpisodeDigest:
    """All the spool needs of a record besides its bytes: the summary's share and the
    rollout numbering key.

    Taken once, when the record is read, so the parsed record can be dropped at once:
    holding thousands of parsed records for the length of an export batch is what made
    Python's garbage collector, not the parsing, the main cost of an export.
    """

    ok: bool
    has_traces: bool
    rollout_key: str
    traces: tuple[TraceScores, ...]


def digest_episode(record: Mapping[str, Any]) -> EpisodeDigest:
    """The digest of a verifiers episode record; ``ValueError`` when its rewards,
    metrics or task are not in the verifiers shape (not numbers, not objects)."""
    try:
        traces = record.get("traces") or ()
        scores = tuple(TraceScores.of(trace) for trace in traces)
        key = json.dumps(rollout_key(record), sort_keys=True, default=str)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"its rewards, metrics or task are not in the verifiers shape ({exc!r})"
        ) from None
    return EpisodeDigest(bool(record.get("ok", False)), bool(traces), key, scores)


class _ScoredTotals:
    """Reward and per-name score/metric totals over one population of traces."""

    __slots__ = ("counts", "reward", "sums", "traces")

    def __init__(self) -> None:
        self.traces = 0
        self.reward = _BuiltinSum()
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, scores: TraceScores) -> None:
        self.traces += 1
        self.reward.add(scores.reward)
        for name, value in scores.values:
            self.sums[name] = self.sums.get(name, 0.0) + value
            self.counts[name] = self.counts.get(name, 0) + 1

    def averages(self) -> tuple[float, dict[str, float]]:
        average_reward = self.reward.result() / self.traces if self.traces else 0.0
        metrics = {name: self.sums[name] / self.counts[name] for name in self.sums}
        return average_reward, metrics

    def to_state(self) -> dict[str, Any]:
        return {
            "traces": self.traces,
            "reward": [_float_state(self.reward.total), _float_state(self.reward.compensation)],
            "sums": {name: _float_state(value) for name, value in self.sums.items()},
            "counts": dict(self.counts),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> _ScoredTotals:
        totals = cls()
        totals.traces = int(state["traces"])
        total, compensation = state["reward"]
        totals.reward = _BuiltinSum(
            _float_from_state(total), float(_float_from_state(compensation))
        )
        totals.sums = {name: float(_float_from_state(v)) for name, v in state["sums"].items()}
        totals.counts = {name: int(count) for name, count in state["counts"].items()}
        return totals


def _float_state(value: Number) -> Number | str:
    """Strict-JSON spelling of a running total: non-finite floats as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def _float_from_state(value: Number | str) -> Number:
    return float(value) if isinstance(value, str) else value


class SummaryAccumulator:
    """The run summary prime-runs computes with ``metrics.from_episodes`` over every
    episode, maintained incrementally so no episode has to be kept.

    Rewards and metrics average over trainable traces (a judge would dilute every mean
    with structural zeros), or over all traces when the run has no trainable trace at
    all; both populations are tracked because which one applies is only known at the
    end. ``avg_error`` is the share of episodes that are not ok, traceless ones included.
    """

    _STATE_VERSION = 1

    def __init__(self) -> None:
        self._episodes = 0
        self._failed = 0
        self._trainable = _ScoredTotals()
        self._everything = _ScoredTotals()

    def add(self, record: Mapping[str, Any]) -> None:
        self.add_digest(digest_episode(record))

    def add_digest(self, digest: EpisodeDigest) -> None:
        self._episodes += 1
        self._failed += not digest.ok
        for scores in digest.traces:
            self._everything.add(scores)
            if scores.trainable:
                self._trainable.add(scores)

    def summary(self) -> dict[str, Any]:
        """``{"avg_reward", "avg_metrics", "avg_error"}`` as the platform receives it:
        prime-runs drops non-finite values (and then an empty ``avg_metrics``) before
        sending, so a NaN reward leaves the key out rather than failing the request."""
        scored = self._trainable if self._trainable.traces else self._everything
        average_reward, average_metrics = scored.averages()
        summary: dict[str, Any] = {}
        if math.isfinite(average_reward):
            summary["avg_reward"] = average_reward
        finite_metrics = {name: v for name, v in average_metrics.items() if math.isfinite(v)}
        if finite_metrics:
            summary["avg_metrics"] = finite_metrics
        summary["avg_error"] = self._failed / self._episodes if self._episodes else 0.0
        return summary

    def to_state(self) -> dict[str, Any]:
        """Strict-JSON state that :meth:`from_state` restores exactly, so the spool can
        commit it in the same transaction as the episode it includes."""
        return {
            "version": self._STATE_VERSION,
            "episodes": self._episodes,
            "failed": self._failed,
            "trainable": self._trainable.to_state(),
            "all": self._everything.to_state(),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SummaryAccumulator:
        version = state.get("version")
        if version != cls._STATE_VERSION:
            raise ValueError(
                f"summary state version {version!r} is not supported (expected "
                f"{cls._STATE_VERSION}); it was written by a different prime-runs-otel "
                "release. Recompute the summary from the stored episodes."
            )
        accumulator = cls()
        accumulator._episodes = int(state["episodes"])
        accumulator._failed = int(state["failed"])
        accumulator._trainable = _ScoredTotals.from_state(state["trainable"])
        accumulator._everything = _ScoredTotals.from_state(state["all"])
        return accumulator
