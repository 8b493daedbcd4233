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

One module per record shape: :mod:`.samples` (v0 sample rows), :mod:`.traces_lines`
(Prime Traces lines), :mod:`.step_table` (the training step table) and :mod:`.summary`
(the run summary); :mod:`.episode` is how all of them read a record and
:mod:`.strict_json` the JSON they write. Their public names are all importable from here.
"""

from __future__ import annotations

from .episode import rollout_key, summary_trace_index
from .samples import (
    MAX_SAMPLES_PAYLOAD_BYTES,
    SampleTooLargeError,
    batch_sample_rows,
    encode_sample_batches,
    encode_samples_body,
    episode_sample_rows,
)
from .step_table import (
    STEP_TABLE_INTERVAL,
    ParquetUnavailableError,
    parquet_available,
    require_parquet,
    step_table_parquet,
    step_table_rows,
    unnamed_step_table,
    with_run_id,
)
from .summary import EpisodeDigest, SummaryAccumulator, TraceScores, digest_episode
from .traces_lines import (
    RUN_ID_PLACEHOLDER,
    LineTemplate,
    stamp_run,
    traces_line,
    traces_line_template,
)

__all__ = [
    "MAX_SAMPLES_PAYLOAD_BYTES",
    "RUN_ID_PLACEHOLDER",
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
    "unnamed_step_table",
    "with_run_id",
]
