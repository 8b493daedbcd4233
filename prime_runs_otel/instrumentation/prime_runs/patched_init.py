"""``prime_runs.init(...)`` answered by this package: the run handed back has
the surface of prime-runs' ``Run`` (``run.py``) and reports through
OpenTelemetry, to the exporter ``OTEL_TRACES_EXPORTER`` names (``..delivery``).

prime-runs' own transport is never used, except for ``mode="disabled"`` (or
``PRIME_RUNS_MODE=disabled``, or ``OTEL_TRACES_EXPORTER=none``): such a run
sends nothing, so the original ``init`` answers it, exactly as before.
Delivered in process, an online run is registered with the platform before
``init()`` returns, as prime-runs does, so its id is the platform's.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import prime_runs as pr
from opentelemetry.sdk.trace.export import SpanExporter

from ...config import resolve_settings
from ...errors import ConfigError, PrimeRunsOtelError
from ..delivery import IN_PROCESS, Delivery, Exported, InProcess, exporter_names, load_exporter
from .run import InstrumentedRun
from .run_spec import RunSpec, run_mode

__all__ = ["INIT_TIMEOUT_ENV", "init_run"]

logger = logging.getLogger(__name__)

#: How long ``init()`` waits for the platform to have the run, so that the
#: run's id is the platform's, as prime-runs gives it. Past it the run goes on
#: under this package's own key (the platform id is stamped on every record
#: when it is delivered) and nothing is lost.
INIT_TIMEOUT_ENV = "PRIME_RUNS_OTEL_INIT_TIMEOUT"
DEFAULT_INIT_TIMEOUT = 30.0


def init_run(original: Callable[..., Any], **kwargs: Any) -> Any:
    """The patched ``prime_runs.init``: same arguments, same validation."""
    exporters = exporter_names()
    mode = run_mode(kwargs.get("mode"))
    if mode == "disabled" or not exporters:
        return original(**kwargs)
    spec = RunSpec.from_init(kwargs)
    on_error = kwargs.get("on_error", "warn")
    if on_error not in ("warn", "raise"):
        raise pr.ConfigurationError(f"on_error={on_error!r} is not one of 'warn' or 'raise'")
    in_process = IN_PROCESS in exporters
    others = [_load_exporter(name) for name in exporters if name != IN_PROCESS]
    try:
        if in_process:
            delivery: Delivery = _open_in_process(spec, mode, others)
        else:
            delivery = Exported.open(spec.fields, spec.config, others)
    except PrimeRunsOtelError as exc:
        raise pr.ConfigurationError(str(exc)) from exc
    return InstrumentedRun(delivery, spec, on_error=on_error)


def _load_exporter(name: str) -> SpanExporter:
    """The exporter ``name``, or prime-runs' refusal of a setting."""
    try:
        return load_exporter(name)
    except ConfigError as exc:
        raise pr.ConfigurationError(str(exc)) from exc


def _open_in_process(spec: RunSpec, mode: str | None, others: Sequence[SpanExporter]) -> InProcess:
    settings = resolve_settings(
        **spec.api,
        team_id=spec.fields["team_id"],
        mode=mode,
        finish_timeout=spec.finish_timeout,
    )
    delivery = InProcess.open(spec.fields, spec.config, settings, others)
    if delivery.mode == "online":
        _wait_for_the_platform(delivery, spec)
    return delivery


def _wait_for_the_platform(delivery: InProcess, spec: RunSpec) -> None:
    """prime-runs creates the run before ``init()`` returns and hands out
    its platform id; so does this, within ``PRIME_RUNS_OTEL_INIT_TIMEOUT``.
    A run the platform refused for good is an error here, as it is there;
    one it has not answered for yet goes on and is delivered later."""
    timeout = _init_timeout()
    state = delivery.run.wait_registered(timeout)
    if state.platform_id is not None:
        delivery.platform_id = state.platform_id
        return
    if state.error:
        delivery.run.finish("failed", state.error, timeout=0)
        raise pr.PrimeRunsError(
            f"the platform refused run {spec.name or delivery.local_id!r}: {state.error}"
        )
    logger.warning(
        "Run %s: the platform has not registered the run within %.0fs; it goes on under "
        "this id and is delivered when the platform answers (nothing is lost)",
        delivery.local_id,
        timeout,
    )


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
