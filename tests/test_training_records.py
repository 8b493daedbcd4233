"""The training half of the span contract: training fields on the Resource,
step metrics spans, the step an episode is training work of, and episode
spans without a record, each produced through a real SDK pipeline and read
back with ``records.read_span``."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prime_runs_otel import semconv as sc
from prime_runs_otel.errors import ConfigError
from prime_runs_otel.produce.episode import record_episode
from prime_runs_otel.produce.resource import run_resource
from prime_runs_otel.produce.run_spans import emit_metrics
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.produce.traced_episode import episode_span, score_episode
from prime_runs_otel.read.checks import derived_episode_id, read_span, record_step, run_identity
from prime_runs_otel.read.episodes import CorruptEpisode, EpisodeArrival
from prime_runs_otel.read.records import CorruptMetrics, RunIdentity, RunMetrics, UnrecordedEpisode
from prime_runs_otel.read.spans import SpanView, from_readable_span


class Pipeline:
    def __init__(self, resource: Resource) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def views(self) -> list[SpanView]:
        return [from_readable_span(span) for span in self.exporter.get_finished_spans()]

    def meanings(self) -> list[Any]:
        return [meaning for view in self.views() if (meaning := read_span(view)) is not None]


@pytest.fixture
def train() -> Iterator[Pipeline]:
    pipeline = Pipeline(run_resource(kind="train", model="base/model", max_steps=50))
    yield pipeline
    pipeline.provider.shutdown()


def test_training_fields_travel_on_the_resource() -> None:
    resource = run_resource(
        run_id="r1",
        kind="train",
        model="Qwen/Qwen3-4B",
        environments=["gsm8k"],
        team_id="team-a",
        max_steps=200,
        batch_size=128,
        rollouts_per_example=8,
        seq_len=4096,
        wandb_project="rl",
        wandb_entity="acme",
        wandb_run_name="try-3",
    )
    identity = run_identity(resource.attributes)
    assert identity == RunIdentity(
        local_id="r1",
        kind="train",
        model="Qwen/Qwen3-4B",
        environments=("gsm8k",),
        team_id="team-a",
        max_steps=200,
        batch_size=128,
        rollouts_per_example=8,
        seq_len=4096,
        wandb_project="rl",
        wandb_entity="acme",
        wandb_run_name="try-3",
    )
    assert RunIdentity.from_json(identity.to_json()) == identity


def test_training_fields_from_the_environment_are_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES",
        "prime.run.max_steps=300,prime.run.seq_len=2048,prime.run.batch_size=lots",
    )
    identity = run_identity(run_resource(kind="train").attributes)
    assert identity is not None
    assert (identity.max_steps, identity.seq_len, identity.batch_size) == (300, 2048, None)


def test_a_verbatim_metrics_span_reads_back_as_the_row_it_carries(train: Pipeline) -> None:
    """A row posted as logged (``prime.run.metrics.verbatim``): the whole row,
    its float step and its key order as given, no ``_timestamp``; the
    span's whole step only says where it belongs."""
    row = {"eval/reward": 0.75, "empty": {}, "step": 10.0}
    assert emit_metrics(train.tracer, row, step=10, verbatim=True) == 10
    [metrics] = train.meanings()
    assert isinstance(metrics, RunMetrics) and metrics.verbatim and metrics.step == 10
    assert list(metrics.row().items()) == list(row.items())
    assert type(metrics.row()["step"]) is float
    [view] = train.views()
    assert view.attributes[sc.RUN_METRICS_VERBATIM] is True
    assert metrics.key == derived_episode_id(view)  # a copy of the span is one post
    with pytest.raises(ConfigError, match="not JSON-serialisable"):
        emit_metrics(train.tracer, {"loss": math.nan}, step=1, verbatim=True)


def _parquet(run_id: str) -> bytes:
    from prime_runs_otel.read.projection import step_table_parquet

    records = [synthetic_episode(index, seed=3) for index in range(3)]
    body = step_table_parquet(records, run_id, 10)
    assert body is not None
    return body


def test_a_sample_table_span_carries_the_object_and_the_run_id_is_filled_in_later(
    train: Pipeline,
) -> None:
    """The producer writes the object without the platform's id; the span
    brings its bytes whole; the id filled in gives the object written with
    it (the same bytes every time), and an object that already names a run,
    or is not Parquet, is refused as damaged."""
    import pyarrow.parquet as pq

    from prime_runs_otel.produce.run_spans import emit_step_table
    from prime_runs_otel.read.projection import with_run_id
    from prime_runs_otel.read.records import RunSamples

    body = _parquet("")
    emit_step_table(train.tracer, 10, body)
    [table] = train.meanings()
    assert isinstance(table, RunSamples) and (table.step, table.body) == (10, body)
    named = with_run_id(body, "platform-run")
    assert named == with_run_id(body, "platform-run")
    written = pq.read_table(io.BytesIO(_parquet("platform-run")))
    filled = pq.read_table(io.BytesIO(named))
    assert filled.schema == written.schema
    assert (
        filled.drop_columns(["created_at"]).to_pylist()
        == written.drop_columns(["created_at"]).to_pylist()
    )
    assert with_run_id(named, "another") == named  # a named object is left as it is

    emit_step_table(train.tracer, 10, named)
    emit_step_table(train.tracer, 20, b"not parquet")
    refused = train.meanings()[1:]
    assert [type(item) for item in refused] == [CorruptMetrics, CorruptMetrics]
    assert [item.step for item in refused if isinstance(item, CorruptMetrics)] == [10, 20]


def test_naming_a_sample_table_leaves_pyarrow_dataset_unimported() -> None:
    """Filling in a table's run id reads it with ``ParquetFile``: the same
    table as ``read_table``, without the ``pyarrow.dataset`` import that
    every delivering process paid once (about 40 ms of CPU)."""
    script = (
        "import sys\n"
        "from prime_runs_otel.produce.synthetic import synthetic_episode\n"
        "from prime_runs_otel.read.projection import step_table_parquet, with_run_id\n"
        "body = step_table_parquet([synthetic_episode(0)], '', 10)\n"
        "assert with_run_id(body, 'platform-run') != body\n"
        "print('pyarrow.dataset' in sys.modules, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stderr


def test_reading_a_sample_table_starts_no_thread() -> None:
    """Reading a sample table must not leave pyarrow's thread pool running:
    pyarrow then aborts the process at exit in many runs ("terminate called
    without an active exception", exit code 134) after its work is done, so
    a delivering process would end with the wrong code. The abort is a race;
    the threads it comes from are counted exactly (the process's own tasks,
    in a fresh process where nothing else started pyarrow's pools)."""
    script = (
        "import os\n"
        "from prime_runs_otel.produce.synthetic import synthetic_episode\n"
        "from prime_runs_otel.read.projection import step_table_parquet, with_run_id\n"
        "from prime_runs_otel.read.projection.step_table import unnamed_step_table\n"
        "body = step_table_parquet([synthetic_episode(0)], '', 10)\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "assert unnamed_step_table(body) == 1\n"
        "assert with_run_id(body, 'platform-run') != body\n"
        "print(len(os.listdir('/proc/self/task')) - before, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert (done.stdout.strip(), done.returncode) == ("0", 0), done.stderr[-500:]


def test_training_fields_belong_to_training_runs() -> None:
    with pytest.raises(ConfigError, match="max_steps only apply to a training run"):
        run_resource(kind="eval", max_steps=10)
    with pytest.raises(ConfigError, match="seq_len must be a whole number"):
        run_resource(kind="train", seq_len=-1)


def test_a_metrics_span_reads_back_as_the_platform_row(train: Pipeline) -> None:
    step = emit_metrics(
        train.tracer,
        {"loss": 0.25, "lr": 1e-6, "nan": math.nan, "nested": {"inf": math.inf}, "tag": "a"},
        step=7,
        timestamp=1_767_225_600.5,
    )
    assert step == 7
    [metrics] = train.meanings()
    assert metrics == RunMetrics(
        step=7, values={"loss": 0.25, "lr": 1e-6, "tag": "a"}, timestamp=1_767_225_600.5
    )
    assert metrics.row() == {
        "loss": 0.25,
        "lr": 1e-6,
        "tag": "a",
        "step": 7,
        "_timestamp": 1_767_225_600.5,
    }
    [view] = train.views()
    assert view.name == sc.RUN_METRICS_SPAN
    assert view.start_ns == 1_767_225_600_500_000_000


def test_the_step_may_come_with_the_values(train: Pipeline) -> None:
    emit_metrics(train.tracer, {"step": 3, "reward/mean": 0.5})
    [metrics] = train.meanings()
    assert isinstance(metrics, RunMetrics)
    assert metrics.step == 3 and metrics.values == {"reward/mean": 0.5}
    assert metrics.timestamp > 1_700_000_000


@pytest.mark.parametrize(
    ("values", "step", "message"),
    [
        ({"loss": 1.0}, None, "needs its training step"),
        ({"loss": 1.0}, -2, "needs its training step"),
        ({"loss": object()}, 1, "not JSON-serialisable"),
    ],
)
def test_a_metrics_row_that_cannot_be_sent_is_refused_at_the_source(
    train: Pipeline, values: dict[str, Any], step: int | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        emit_metrics(train.tracer, values, step=step)
    assert train.views() == []


def test_damaged_metrics_are_a_counted_loss(train: Pipeline) -> None:
    emit_metrics(train.tracer, {"loss": 0.5}, step=4)
    [view] = train.views()
    attributes = dict(view.attributes)
    attributes[sc.RUN_METRICS_VALUES] = ['{"loss": 0.']
    meaning = read_span(replace(view, attributes=attributes))
    assert isinstance(meaning, CorruptMetrics)
    assert meaning.step == 4 and "truncated" in meaning.reason
    del attributes[sc.RUN_STEP]
    meaning = read_span(replace(view, attributes=attributes))
    assert isinstance(meaning, CorruptMetrics) and meaning.step is None


@pytest.mark.parametrize("step", [-1, -(2**63)])
def test_a_metrics_span_with_a_negative_step_is_a_counted_loss(train: Pipeline, step: int) -> None:
    """Steps count from 0 (prime-rl's, and what the platform keeps rows by):
    a negative one from another producer is refused, not sent on."""
    emit_metrics(train.tracer, {"loss": 0.5}, step=4)
    [view] = train.views()
    attributes = {**dict(view.attributes), sc.RUN_STEP: step}
    meaning = read_span(replace(view, attributes=attributes))
    assert isinstance(meaning, CorruptMetrics) and "0 or more" in meaning.reason


def _train_record(step: int | None, work_type: str = "train") -> dict[str, Any]:
    record = synthetic_episode(0, seed=4)
    record["run"] = {"type": "train", "id": "local", "name": "rl"}
    if step is not None:
        record["run"]["work"] = {"type": work_type, "step": step}
    return record


def test_an_episode_carries_the_step_it_is_training_work_of(train: Pipeline) -> None:
    record_episode(train.tracer, _train_record(12))
    record_episode(train.tracer, {**_train_record(13, "eval"), "id": "eval-work"})
    arrivals = [m for m in train.meanings() if isinstance(m, EpisodeArrival)]
    assert [(arrival.episode_id, arrival.step) for arrival in arrivals] == [
        (_train_record(12)["id"], 12),
        ("eval-work", None),
    ]


def test_record_step_falls_back_to_the_span_attribute() -> None:
    assert record_step(_train_record(None), 5) == 5
    assert record_step(_train_record(None), "6") == 6
    assert record_step(_train_record(9), 5) == 9
    assert record_step(_train_record(9, "eval"), 5) is None
    assert record_step({"id": "x"}, None) is None


def test_an_episode_span_without_a_record_is_to_be_synthesised(train: Pipeline) -> None:
    with episode_span(train.tracer, example_id=3, step=20, env="arith") as span:
        score_episode(span, 1.0, scores={"correct": 1.0}, metrics={"turns": 2})
    [meaning] = train.meanings()
    assert isinstance(meaning, UnrecordedEpisode)
    assert meaning.episode_id == derived_episode_id(meaning.view)
    attributes = meaning.view.attributes
    assert attributes[sc.EPISODE_EXAMPLE_ID] == 3 and attributes[sc.RUN_STEP] == 20
    assert attributes[sc.EPISODE_REWARD] == 1.0
    assert attributes[sc.AGENT_REWARD_PREFIX + "correct"] == 1.0
    assert attributes[sc.AGENT_METRIC_PREFIX + "turns"] == 2.0
    assert meaning.view.name == "episode arith"


def test_an_episode_span_may_name_its_own_id(train: Pipeline) -> None:
    with episode_span(train.tracer, example_id="q-1", episode_id="ep-1"):
        pass
    [meaning] = train.meanings()
    assert isinstance(meaning, UnrecordedEpisode) and meaning.episode_id == "ep-1"


def test_an_exception_in_the_episode_marks_it_failed(train: Pipeline) -> None:
    with pytest.raises(RuntimeError), episode_span(train.tracer, example_id=1):
        raise RuntimeError("sandbox died")
    [view] = train.views()
    assert view.status_error and "sandbox died" in (view.status_message or "")


def test_episode_span_checks_its_arguments(train: Pipeline) -> None:
    with (
        pytest.raises(ConfigError, match="example_id"),
        episode_span(train.tracer, example_id=True),
    ):
        pass
    with (
        pytest.raises(ConfigError, match="step"),
        episode_span(train.tracer, example_id=1, step=-1),
    ):
        pass


def test_a_partial_record_is_damaged_not_synthesised(train: Pipeline) -> None:
    record_episode(train.tracer, _train_record(1))
    episode = next(v for v in train.views() if sc.EPISODE_ID in v.attributes)
    attributes = dict(episode.attributes)
    del attributes[sc.EPISODE_RECORD]
    meaning = read_span(replace(episode, attributes=attributes))
    assert isinstance(meaning, CorruptEpisode)
    assert "missing" in meaning.reason
