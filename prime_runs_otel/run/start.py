"""``start_run()``: the options of one run resolved, and its pipeline wired
(Resource, TracerProvider, span batches, exporter, the providers beside
it), before the run-start span goes out."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry._logs import LoggerProvider
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource

from ..batching import bsp_settings
from ..config import Settings, refuse_overrides, resolve_settings
from ..errors import ConfigError
from ..exporter import PrimeRunsSpanExporter
from ..produce.resource import run_resource
from ..produce.run_batches import ProducerBatches
from ..produce.run_config import normalize_config
from ..produce.run_spans import emit_run_start
from ..read.projection import parquet_available
from ..sampling import without_sdk
from .providers import RunProviders, RunTracerProvider, child_spans_setting
from .recording import Run


def start_run(
    *,
    name: str | None = None,
    model: str | None = None,
    environments: Sequence[str] = (),
    framework: str | None = None,
    config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    kind: str = "eval",
    tags: Sequence[str] = (),
    description: str | None = None,
    attach: str | None = None,
    run_id: str | None = None,
    team_id: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    mode: str | None = None,
    spool_dir: str | os.PathLike[str] | None = None,
    finish_timeout: float | None = None,
    capture_content: bool | None = None,
    settings: Settings | None = None,
    max_steps: int | None = None,
    batch_size: int | None = None,
    rollouts_per_example: int | None = None,
    seq_len: int | None = None,
    wandb_project: str | None = None,
    wandb_entity: str | None = None,
    wandb_run_name: str | None = None,
    owns_run: bool = True,
    child_spans: bool | None = None,
    meter_provider: MeterProvider | None = None,
    logger_provider: LoggerProvider | None = None,
) -> Run:
    """Open a run: a Resource naming it, a TracerProvider whose batches
    (``OTEL_BSP_*``) go to :class:`PrimeRunsSpanExporter`, and the run-start
    span carrying its config (sent once, as the run's platform metadata).

    ``config`` is a mapping of the settings somebody chose and/or the path of
    the file the run was launched from (``config_file``), kept byte for byte
    under ``config_source``. Nothing in it is redacted: keep secrets in the
    environment.

    ``kind="train"`` opens a training run: ``model`` is the base model,
    ``max_steps`` to ``wandb_run_name`` what it is registered with, and its
    team (``team_id`` or ``PRIME_TEAM_ID``) if it has one: without, it belongs
    to the user's own account, as prime-rl registers it. Every process feeding one
    training run passes the same ``run_id``; the one that owns the run (the
    trainer, which logs the step metrics) keeps ``owns_run=True`` and ends it,
    the others (inference workers, an orchestrator) pass ``owns_run=False``.
    ``attach`` joins a run a launcher already registered (a hosted run's id).

    ``child_spans`` turns the GenAI agent and model-call spans under each
    episode span on or off (``PRIME_RUNS_OTEL_CHILD_SPANS``); by default they
    are emitted once a span processor is added to ``run.tracer_provider``,
    since the platform reads only the episode span.

    ``meter_provider`` and ``logger_provider`` receive the run's metrics
    (step metrics, rewards, the GenAI client histograms) and GenAI events
    (``gen_ai.evaluation.result``, and the inference details when content
    capture asks for events). Without them the run opens its own, with its
    Resource, as ``OTEL_METRICS_EXPORTER`` and ``OTEL_LOGS_EXPORTER`` say,
    and none when those are unset. The run's own spans are never sampled
    away, whatever ``OTEL_TRACES_SAMPLER`` says; ``OTEL_SDK_DISABLED=true``
    means what ``PRIME_RUNS_MODE=disabled`` means.

    ``settings`` (from :func:`~prime_runs_otel.config.resolve_settings`)
    stands for ``api_key``, ``base_url``, ``mode``, ``spool_dir`` and
    ``finish_timeout``: passing one of those with it is a ``TypeError``,
    never an argument silently ignored.
    """
    if kind not in ("eval", "train"):
        raise ValueError(f"kind must be 'eval' or 'train', not {kind!r}")
    settings, metadata = _resolve_options(
        settings,
        config,
        config_file=config_file,
        api_key=api_key,
        base_url=base_url,
        team_id=team_id,
        mode=mode,
        spool_dir=spool_dir,
        finish_timeout=finish_timeout,
    )
    if kind == "train":
        _check_training_run(settings, model=model, attach=attach)
    resource = run_resource(
        run_id=run_id,
        kind=kind,
        name=name,
        model=model,
        environments=environments,
        framework=framework,
        tags=tags,
        description=description,
        attach=attach,
        team_id=team_id,
        max_steps=max_steps,
        batch_size=batch_size,
        rollouts_per_example=rollouts_per_example,
        seq_len=seq_len,
        wandb_project=wandb_project,
        wandb_entity=wandb_entity,
        wandb_run_name=wandb_run_name,
    )
    run = _wire(
        resource,
        settings,
        kind=kind,
        owns_run=owns_run,
        capture_content=capture_content,
        child_spans=child_spans,
        meter_provider=meter_provider,
        logger_provider=logger_provider,
    )
    if owns_run or metadata:
        # A worker's empty config must not stand in for the owner's.
        run.start_link = emit_run_start(run.tracer, metadata, owner=owns_run)
    return run


def _resolve_options(
    settings: Settings | None,
    config: Mapping[str, Any] | str | os.PathLike[str] | None,
    *,
    config_file: str | os.PathLike[str] | None,
    api_key: str | None,
    base_url: str | None,
    team_id: str | None,
    mode: str | None,
    spool_dir: str | os.PathLike[str] | None,
    finish_timeout: float | None,
) -> tuple[Settings, dict[str, Any]]:
    """The run's settings (the ones given, else from the arguments and the
    environment, as ``OTEL_SDK_DISABLED`` leaves them) and its config as
    the platform stores it; an argument that ``settings`` stands for is
    refused first, whatever else is wrong."""
    overrides: dict[str, Any] = {
        "api_key": api_key,
        "base_url": base_url,
        "mode": mode,
        "spool_dir": spool_dir,
        "finish_timeout": finish_timeout,
    }
    refuse_overrides(settings, "start_run", **overrides)
    metadata = normalize_config(config, config_file=config_file)
    settings = without_sdk(settings or resolve_settings(team_id=team_id, **overrides))
    return settings, metadata


def _wire(
    resource: Resource,
    settings: Settings,
    *,
    kind: str,
    owns_run: bool,
    capture_content: bool | None,
    child_spans: bool | None,
    meter_provider: MeterProvider | None,
    logger_provider: LoggerProvider | None,
) -> Run:
    """The run's pipeline: its TracerProvider, whose batches the run's
    producer thread exports itself (:class:`ProducerBatches`), and the
    MeterProvider and LoggerProvider beside it."""
    exporter = PrimeRunsSpanExporter(
        settings=settings, shutdown_timeout=0.0, ends_runs=owns_run, warn_about_sampler=False
    )
    child_spans = child_spans_setting(child_spans)
    provider = RunTracerProvider(resource=resource)
    processor = ProducerBatches(exporter, bsp_settings())
    provider.add_span_processor(processor)
    local_id = str(resource.attributes["prime.run.id"])
    providers = RunProviders.open(
        resource, meter_provider, logger_provider, disabled=settings.mode == "disabled"
    )
    return Run(
        provider=provider,
        exporter=exporter,
        local_id=local_id,
        finish_timeout=settings.finish_timeout,
        capture_content=capture_content,
        queue=processor,
        kind=kind,
        owns_run=owns_run,
        child_spans=child_spans,
        signals=providers.signals(),
        providers=providers,
    )


def _check_training_run(settings: Settings, *, model: str | None, attach: str | None) -> None:
    """What a training run needs to reach the platform, checked before any
    span: a run that cannot be registered is better refused at start than
    found unregistered after days of training."""
    if settings.mode != "online":
        return
    if attach is None and not model:
        raise ConfigError("a training run needs its base model: pass model=... to start_run()")
    if settings.traces_opt_out and not parquet_available():
        raise ConfigError(
            "opting out of Prime Traces sends a training run's samples to the legacy step "
            "table, which is Parquet and needs pyarrow: pip install -e '.[train]' from the clone"
        )
