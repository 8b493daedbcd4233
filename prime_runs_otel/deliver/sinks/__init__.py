"""Sinks: where a run's episodes go, one module per destination.

- ``traces``: Prime Traces, the system of record (exactly once).
- ``samples``: the legacy sample table of eval runs (at most once).
- ``step_tables``: the legacy per-step Parquet table of training runs.
- ``base``: the contract the episode stream (``deliver/stream.py``) holds
  them to, and the failure all of them treat alike.

Which sink a run uses is the run's ``sink`` in the spool: Prime Traces unless
the account is not on it or the run opted out. A sink knows its destination's
requests and answers; it does not know runs' lifecycles, which are the
business of ``eval_run.py`` and ``training_run.py``.
"""

from .base import Sink, fail_unsendable
from .samples import SAMPLES_BATCH_BYTES, SamplesSink
from .step_tables import SAMPLE_ID_STRIDE, StepTablesSink
from .traces import MAX_BATCH_EPISODES, TRACES_BATCH_BYTES, TracesSink

__all__ = [
    "MAX_BATCH_EPISODES",
    "SAMPLES_BATCH_BYTES",
    "SAMPLE_ID_STRIDE",
    "TRACES_BATCH_BYTES",
    "SamplesSink",
    "Sink",
    "StepTablesSink",
    "TracesSink",
    "fail_unsendable",
]
