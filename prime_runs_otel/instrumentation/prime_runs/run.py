"""``prime_runs.init(...)`` answered by this package.

The run handed back has the surface of prime-runs' ``Run`` that its callers
use (verifiers' ``vf-eval --push`` and its dashboard, training loops), and
reports through OpenTelemetry: one TracerProvider per run, whose Resource
names the run, and the exporter ``OTEL_TRACES_EXPORTER`` names. With
``prime_runs`` (or nothing set) the run is delivered in process: spool, then
platform, as ``start_run`` does, and its attributes read the spool, so a
progress display sees what is pending, failed or refused at that moment.
With ``otlp`` the spans go to a collector and ``prime-runs-otel serve``,
which owns delivery; this process then knows only what it sent.

prime-runs' own transport is never used, except for ``mode="disabled"`` (or
``PRIME_RUNS_MODE=disabled``, or ``OTEL_TRACES_EXPORTER=none``): such a run
sends nothing, so the original ``init`` answers it, exactly as before.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Literal

import prime_runs as pr
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from ... import semconv as sc
from ..._json import clean_metric_values
from ...config import env_flag, resolve_settings
from ...errors import PrimeRunsOtelError
from ...produce.episode import record_episode
from ...produce.resource import run_resource
from ...produce.run_config import normalize_config
from ...produce.run_spans import emit_metrics, emit_run_end, emit_run_start
from ...run import (
    CHILD_SPANS_ENV,
    QueueGauge,
    Run,
    RunResult,
    batch_processor,
    start_run,
)

logger = logging.getLogger(__name__)

#: The exporter that keeps delivery in this process.
IN_PROCESS = "prime_runs"
#: How long ``init()`` waits for the platform to have the run, so that the
#: run's id is the platform's, as prime-runs gives it. Past it the run goes on
#: under this package's own key (the platform id is stamped on every record
#: when it is delivered) and nothing is lost.
INIT_TIMEOUT_ENV = "PRIME_RUNS_OTEL_INIT_TIMEOUT"
DEFAULT_INIT_TIMEOUT = 30.0
#: Records this package could not take, under ``failed_records``.
SINK_NAME = "prime-runs-otel"
CRASHED_ERROR = "process exited without finishing the run"


def init_run(original: Callable[..., Any], **kwargs: Any) -> Any:
    """The patched ``prime_runs.init``: same arguments, same validation."""
    exporters = _exporter_names()
    mode = _mode(kwargs.get("mode"))
    if mode == "disabled" or not exporters:
        return original(**kwargs)
    spec = _RunSpec.from_init(kwargs)
    on_error = kwargs.get("on_error", "warn")
    if on_error not in ("warn", "raise"):
        raise pr.ConfigurationError(f"on_error={on_error!r} is not one of 'warn' or 'raise'")
    in_process = IN_PROCESS in exporters
    others = [_load_exporter(name) for name in exporters if name != IN_PROCESS]
    try:
        if in_process:
            delivery: _Delivery = _InProcess.open(spec, mode, others)
        else:
            delivery = _Exported.open(spec, others)
    except PrimeRunsOtelError as exc:
        raise pr.ConfigurationError(str(exc)) from exc
    return InstrumentedRun(delivery, spec, on_error=on_error)


# ---------------------------------------------------------------------------
# What init() was asked for
# ---------------------------------------------------------------------------


class _RunSpec:
    """``init()``'s arguments, checked as prime-runs checks them and put in
    the terms of this package's run Resource."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields
        self.kind: str = fields["kind"]
        self.attach: str | None = fields["attach"]
        self.name: str | None = fields["name"]
        self.config: dict[str, Any] = fields.pop("config")
        self.api: dict[str, Any] = fields.pop("api")
        self.finish_timeout: float | None = fields.pop("finish_timeout")

    @classmethod
    def from_init(cls, kwargs: Mapping[str, Any]) -> _RunSpec:
        known = {
            "name", "environments", "model", "framework", "description", "tags", "config",
            "mode", "team_id", "api_key", "base_url", "on_error", "finish_timeout", "kind",
            "id", "training", "traces_opt_out",
        }  # fmt: skip
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"init() got unexpected keyword argument(s): {', '.join(unknown)}")
        kind = kwargs.get("kind", "eval")
        if kind not in ("eval", "train"):
            raise pr.ConfigurationError(f"kind={kind!r} is not one of 'eval' or 'train'")
        training = kwargs.get("training")
        if training is not None and kind != "train":
            raise pr.ConfigurationError("training= only applies to kind='train'")
        fields: dict[str, Any] = {
            "kind": kind,
            "attach": kwargs.get("id"),
            "name": kwargs.get("name"),
            "model": kwargs.get("model"),
            "framework": kwargs.get("framework"),
            "description": kwargs.get("description"),
            "tags": list(kwargs.get("tags") or []),
            "environments": [_environment(entry) for entry in kwargs.get("environments") or []],
            "team_id": kwargs.get("team_id"),
            "config": _config(kwargs.get("config")),
            "finish_timeout": kwargs.get("finish_timeout"),
            "api": {
                "api_key": kwargs.get("api_key"),
                "base_url": kwargs.get("base_url"),
                "traces_opt_out": kwargs.get("traces_opt_out"),
            },
        }
        if training is not None:
            fields.update(
                max_steps=training.max_steps,
                batch_size=training.batch_size,
                rollouts_per_example=training.rollouts_per_example,
                seq_len=training.seq_len,
                wandb_project=training.wandb_project,
                wandb_entity=training.wandb_entity,
                wandb_run_name=training.wandb_run_name,
            )
        return cls(**fields)


def _environment(entry: Any) -> str:
    """A hub name or ``owner/name``, from whatever prime-runs accepts."""
    if isinstance(entry, str):
        return entry
    ref = pr.EnvironmentRef.coerce(entry)
    if ref.slug or ref.name:
        return str(ref.slug or ref.name)
    raise pr.ConfigurationError(
        f"environment {entry!r} is given by platform id only; prime-runs-otel resolves "
        "environments by hub name or owner/name: pass that instead"
    )


def _config(value: Any) -> dict[str, Any]:
    """The run config as prime-runs stores it: a mapping as given, a file
    (path or ``ConfigSource``) byte for byte under ``config_source``."""
    if value is None or isinstance(value, Mapping):
        return dict(value or {})
    if isinstance(value, pr.ConfigSource):
        return {pr.CONFIG_SOURCE_KEY: value.to_dict()}
    if isinstance(value, (str, os.PathLike)):
        try:
            return normalize_config(value)
        except (OSError, PrimeRunsOtelError) as exc:
            raise pr.ConfigurationError(str(exc)) from exc
    raise TypeError(
        f"config must be a path to the run's config file or a mapping, got {type(value).__name__}"
    )


def _mode(mode: Any) -> str | None:
    """prime-runs' rule (the argument, else ``PRIME_RUNS_MODE``), plus this
    package's ``local``, which wins even over a caller's ``mode="online"``
    (``vf-eval --push`` always asks for online): it is the user's say."""
    env = os.environ.get(pr.MODE_ENV, "").strip().lower()
    if mode not in (None, "online", "disabled"):
        raise pr.ConfigurationError(f"mode={mode!r} is not one of 'online' or 'disabled'")
    if mode == "disabled" or (mode is None and env == "disabled"):
        return "disabled"
    if env == "local":
        return "local"
    return mode  # type: ignore[no-any-return]


def _exporter_names() -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names, as the SDK reads it
    (``otlp`` follows ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``). Unset means
    in process: whoever turned the instrumentation on wants this package."""
    from opentelemetry.sdk._configuration import _get_exporter_entry_point

    raw = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        return [IN_PROCESS]
    if raw.lower() == "none":
        return []
    names = [name.strip() for name in raw.split(",") if name.strip()]
    return [str(_get_exporter_entry_point(name, "traces")) for name in names]


def _load_exporter(name: str) -> SpanExporter:
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        raise pr.ConfigurationError(
            f"OTEL_TRACES_EXPORTER names {name!r}, but no installed package provides a span "
            f"exporter of that name; use {IN_PROCESS} or otlp, or install its package"
        )
    exporter_class = next(iter(found)).load()
    exporter: SpanExporter = exporter_class()
    return exporter


# ---------------------------------------------------------------------------
# Delivery: in process, or through an exporter (OTLP to a collector)
# ---------------------------------------------------------------------------


class _Delivery:
    """What the run handle needs of a pipeline."""

    local_id: str
    platform_id: str | None = None

    def record(self, episode: Any) -> None:
        raise NotImplementedError

    def metrics(self, values: Mapping[str, Any], step: int | None) -> None:
        raise NotImplementedError

    def end(
        self,
        status: str,
        error: str | None,
        timeout: float | None,
        summary: Mapping[str, Any],
    ) -> RunResult | None:
        raise NotImplementedError

    def snapshot(self) -> RunResult | None:
        return None

    def flush(self, timeout: float) -> bool:
        raise NotImplementedError

    @property
    def mode(self) -> str:
        return "online"


class _InProcess(_Delivery):
    """``start_run``'s pipeline: exporter, spool and uploader in this process."""

    def __init__(self, run: Run, attach: str | None) -> None:
        self.run = run
        self.local_id = run.id
        self.platform_id = attach

    @classmethod
    def open(cls, spec: _RunSpec, mode: str | None, others: Sequence[SpanExporter]) -> _InProcess:
        settings = resolve_settings(
            **spec.api,
            team_id=spec.fields["team_id"],
            mode=mode,
            finish_timeout=spec.finish_timeout,
        )
        run = start_run(**spec.fields, config=spec.config, settings=settings)
        for exporter in others:
            run.tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        delivery = cls(run, spec.attach)
        if run.settings.mode == "online":
            delivery._wait_for_the_platform(spec)
        return delivery

    def _wait_for_the_platform(self, spec: _RunSpec) -> None:
        """prime-runs creates the run before ``init()`` returns and hands out
        its platform id; so does this, within ``PRIME_RUNS_OTEL_INIT_TIMEOUT``.
        A run the platform refused for good is an error here, as it is there;
        one it has not answered for yet goes on and is delivered later."""
        timeout = _init_timeout()
        state = self.run.wait_registered(timeout)
        if state.platform_id is not None:
            self.platform_id = state.platform_id
            return
        if state.error:
            self.run.finish("failed", state.error, timeout=0)
            raise pr.PrimeRunsError(
                f"the platform refused run {spec.name or self.local_id!r}: {state.error}"
            )
        logger.warning(
            "Run %s: the platform has not registered the run within %.0fs; it goes on under "
            "this id and is delivered when the platform answers (nothing is lost)",
            self.local_id,
            timeout,
        )

    def record(self, episode: Any) -> None:
        self.run.record_episode(episode)

    def metrics(self, values: Mapping[str, Any], step: int | None) -> None:
        self.run.log_metrics(values, step=step)

    def end(
        self,
        status: str,
        error: str | None,
        timeout: float | None,
        summary: Mapping[str, Any],
    ) -> RunResult | None:
        return self.run.finish(status, error, timeout=timeout, summary=summary)

    def snapshot(self) -> RunResult | None:
        return self.run.snapshot()

    def flush(self, timeout: float) -> bool:
        return self.run.wait_delivered(timeout)

    @property
    def mode(self) -> str:
        return self.run.settings.mode


class _Exported(_Delivery):
    """Spans to other exporters only (OTLP to a collector and ``serve``),
    which own delivery: this process reports the run's boundaries and its
    episodes, and knows only what it handed over."""

    def __init__(
        self, provider: TracerProvider, processors: Sequence[SpanProcessor], spec: _RunSpec
    ) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("prime_runs_otel")
        self.local_id = str(provider.resource.attributes[sc.RUN_ID])
        self.platform_id = spec.attach
        self.kind = spec.kind
        self.recorded = 0
        self.child_spans = env_flag(CHILD_SPANS_ENV) is not False
        self._gauges = [
            gauge
            for processor in processors
            if isinstance(processor, BatchSpanProcessor)
            for gauge in [QueueGauge.of(processor)]
            if gauge is not None
        ]
        self._pid = os.getpid()

    @classmethod
    def open(cls, spec: _RunSpec, exporters: Sequence[SpanExporter]) -> _Exported:
        resource = run_resource(**spec.fields)
        provider = TracerProvider(resource=resource)
        processors: list[SpanProcessor] = []
        for exporter in exporters:
            processor = batch_processor(exporter)
            provider.add_span_processor(processor)
            processors.append(processor)
        delivery = cls(provider, processors, spec)
        emit_run_start(delivery.tracer, spec.config)
        return delivery

    def record(self, episode: Any) -> None:
        for gauge in self._gauges:
            gauge.wait_for_room()
        record_episode(self.tracer, episode, child_spans=self.child_spans)
        self.recorded += 1

    def metrics(self, values: Mapping[str, Any], step: int | None) -> None:
        if self.kind == "train":
            emit_metrics(self.tracer, values, step=step)

    def end(
        self,
        status: str,
        error: str | None,
        timeout: float | None,
        summary: Mapping[str, Any],
    ) -> RunResult | None:
        if os.getpid() == self._pid:  # a forked child leaves the run to its parent
            emit_run_end(
                self.tracer, status, error, episodes_recorded=self.recorded, summary=summary
            )
        budget = 30.0 if timeout is None else max(0.0, timeout)
        self.provider.force_flush(int(budget * 1000))
        self.provider.shutdown()
        return None

    def flush(self, timeout: float) -> bool:
        return self.provider.force_flush(int(timeout * 1000))


def _init_timeout() -> float:
    raw = os.environ.get(INIT_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_INIT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise pr.ConfigurationError(
            f"{INIT_TIMEOUT_ENV}={raw!r} is not a number of seconds"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise pr.ConfigurationError(f"{INIT_TIMEOUT_ENV} must be 0 or more seconds, got {raw!r}")
    return value


# ---------------------------------------------------------------------------
# The run handle
# ---------------------------------------------------------------------------


class InstrumentedRun:
    """prime-runs' ``Run``, as its callers use it, reported through this package.

    Like prime-runs: ``finish()`` sets the status before it drains (a caller
    aborting meanwhile sees the run is already closing), a ``with`` block
    ends as completed, failed on an exception, cancelled on Ctrl-C, and a
    process that exits without finishing reports the run crashed. Unlike
    it: what is not delivered by ``finish()``'s deadline stays in the spool
    instead of being lost (``prime-runs-otel push`` delivers it).
    """

    def __init__(self, delivery: _Delivery, spec: _RunSpec, *, on_error: str = "warn") -> None:
        self._delivery = delivery
        self._spec = spec
        self._on_error = on_error
        self._id = delivery.platform_id or delivery.local_id
        self._status = pr.RunStatus.RUNNING
        self._finished = False
        self._finishing = False
        self._state_lock = threading.Lock()
        self._finish_lock = threading.Lock()
        self._refused = 0
        self._notes: list[str] = []
        self._deferred: BaseException | None = None
        self._owner_pid = os.getpid()
        self.config: dict[str, Any] = dict(spec.config)
        self.summary: dict[str, Any] = {}
        atexit.register(self._on_process_exit)
        if self.url:
            logger.info("Run %s: %s", self.id, self.url)

    # -- identity and live state -------------------------------------------

    @property
    def id(self) -> str:
        """The platform's id once the platform had the run when ``init()``
        returned (as prime-runs gives it), else this package's run key."""
        return self._id

    @property
    def local_id(self) -> str:
        """This package's key for the run (``prime-runs-otel show`` takes it)."""
        return self._delivery.local_id

    @property
    def name(self) -> str | None:
        return self._spec.name

    @property
    def url(self) -> str | None:
        state = self._delivery.snapshot()
        return state.url if state is not None else None

    @property
    def config_source(self) -> Any:
        raw = self.config.get(pr.CONFIG_SOURCE_KEY)
        return pr.ConfigSource.from_mapping(raw) if isinstance(raw, Mapping) else None

    @property
    def mode(self) -> str:
        """``online``, or this package's ``local`` (kept in the local store)."""
        return self._delivery.mode

    @property
    def status(self) -> pr.RunStatus:
        return self._status

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def kind(self) -> str:
        return self._spec.kind

    @property
    def attached(self) -> bool:
        return self._spec.attach is not None

    @property
    def dropped_records(self) -> int:
        """Records that never reached the spool: refused at its size cap."""
        state = self._delivery.snapshot()
        return state.rejected if state is not None else 0

    @property
    def failed_records(self) -> dict[str, int]:
        """Records that will not reach the platform: refused at hand-off (not
        an episode), refused by the platform, corrupted in transit, or legacy
        rows whose upload may or may not have been stored."""
        state = self._delivery.snapshot()
        failed = self._refused
        if state is not None:
            failed += state.failed - state.rejected + state.corrupt + state.uncertain
        return {SINK_NAME: failed} if failed else {}

    @property
    def pending_records(self) -> int:
        """Episodes in the spool the platform has not confirmed yet."""
        state = self._delivery.snapshot()
        return state.pending if state is not None else 0

    @property
    def errors(self) -> list[str]:
        """What went wrong for good, as prime-runs lists it: a refusal the
        pipeline recorded on the run, and anything noted at hand-off or finish."""
        state = self._delivery.snapshot()
        errors = list(self._notes)
        if state is not None and state.error and state.error not in errors:
            errors.insert(0, state.error)
        return errors

    def __repr__(self) -> str:
        return f"<Run id={self.id!r} mode={self.mode!r} status={self._status.value}>"

    # -- records -------------------------------------------------------------

    def log_episodes(self, episodes: Iterable[Any]) -> None:
        """Episodes (verifiers ``Episode`` objects or their records) become spans
        now, on this thread; one that is not an episode is refused alone."""
        self._require_live("log_episodes")
        batch = list(episodes)
        with self._state_lock:
            self._require_live("log_episodes")
        for episode in batch:
            try:
                self._delivery.record(episode)
            except PrimeRunsOtelError as exc:
                self._refused += 1
                self._note("recording an episode", exc)

    def log_traces(self, traces: Iterable[Any]) -> None:
        raise NotImplementedError(
            "log_traces() is not reported through prime-runs-otel: log whole episodes "
            "(run.log_episodes), which carry their traces"
        )

    def log_metrics(self, values: Mapping[str, Any], *, step: int | None = None) -> None:
        """One training step's metrics (a no-op for evals, as in prime-runs)."""
        self._require_live("log_metrics")
        if self.kind != "train":
            return
        row = dict(values)
        if step is not None:
            row.setdefault("step", step)
        try:
            self._delivery.metrics(row, None)
        except PrimeRunsOtelError as exc:
            self._note("logging metrics", exc)

    def update_summary(self, values: Mapping[str, Any]) -> None:
        with self._state_lock:
            self._require_live("update_summary")
            self.summary.update(clean_metric_values(values))

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Everything logged so far is durable in the spool once this returns
        (in process); ``True`` if nothing is left waiting for the platform."""
        flushed = self._delivery.flush(30.0 if timeout is None else max(0.0, timeout))
        self._raise_deferred()
        return flushed

    # -- the end ---------------------------------------------------------------

    def finish(
        self,
        summary: Mapping[str, Any] | None = None,
        *,
        status: pr.RunStatus | str = pr.RunStatus.COMPLETED,
        error: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """End the run and wait (up to ``timeout``) for its delivery. The
        run's summary is the caller's, as with prime-runs (verifiers passes
        ``prime_runs.metrics.from_episodes`` over its episodes)."""
        with self._finish_lock:
            if self._finished:
                return
            resolved = pr.RunStatus(status)
            if not resolved.is_terminal():
                raise ValueError(f"finish() requires a terminal status, got {resolved.value!r}")
            with self._state_lock:
                self._finishing = True
                self._status = resolved
            if summary:
                self.summary.update(clean_metric_values(summary))
            try:
                self._finish_once(resolved, error, timeout)
            finally:
                with self._state_lock:
                    self._finishing = False
                    self._finished = True
                atexit.unregister(self._on_process_exit)
        self._raise_deferred()

    def _finish_once(self, status: pr.RunStatus, error: str | None, timeout: float | None) -> None:
        if os.getpid() != self._owner_pid:
            # A forked child: what it recorded is flushed, the run is the parent's.
            self._delivery.end(status.value, error, timeout, self.summary)
            return
        try:
            result = self._delivery.end(
                status.value, error or _first(self._notes), timeout, self.summary
            )
        except Exception as exc:
            self._note("finishing the run", exc)
            return
        if result is not None and result.mode == "online" and (result.pending or not result.closed):
            self._notes.append(
                f"{result.pending} episode(s) not delivered yet and the run not closed; nothing "
                f"is lost: they stay in {result.spool_path} and `prime-runs-otel push "
                f"{result.local_id}` delivers them"
            )

    def fail(self, error: str | BaseException, *, timeout: float | None = None) -> None:
        message = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
        self.finish(status=pr.RunStatus.FAILED, error=str(message), timeout=timeout)

    def __enter__(self) -> InstrumentedRun:
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> Literal[False]:
        if exc_type is None:
            self.finish()
            return False
        if isinstance(exc, (KeyboardInterrupt, _cancelled())):
            status, message = pr.RunStatus.CANCELLED, "interrupted"
        else:
            status, message = pr.RunStatus.FAILED, f"{exc_type.__name__}: {exc}"
        try:
            self.finish(status=status, error=message)
        except Exception as finish_error:
            logger.warning("Run %s: finishing after %s failed: %s", self.id, exc, finish_error)
        return False

    def _on_process_exit(self) -> None:
        if self._finished or os.getpid() != self._owner_pid:
            return
        logger.warning("Run %s was never finished; reporting it as crashed", self.id)
        try:
            self.finish(
                status=pr.RunStatus.CRASHED, error="process exited without finishing the run"
            )
        except Exception as exc:
            logger.warning("Run %s: reporting the crash failed: %s", self.id, exc)

    def _require_live(self, operation: str) -> None:
        if self._finishing or self._finished:
            raise pr.RunFinishedError(
                f"{operation}() was called on run {self.id}, which is already finished; "
                "start a new run"
            )

    def _note(self, what: str, exc: BaseException) -> None:
        message = f"{what} failed: {type(exc).__name__}: {exc}"
        self._notes.append(message)
        if self._on_error == "raise":
            if self._deferred is None:
                self._deferred = exc
        else:
            logger.warning("Run %s: %s", self.id, message)

    def _raise_deferred(self) -> None:
        exc, self._deferred = self._deferred, None
        if exc is not None:
            raise exc


def _first(items: Sequence[str]) -> str | None:
    return items[0] if items else None


def _cancelled() -> type[BaseException]:
    import asyncio

    return asyncio.CancelledError
