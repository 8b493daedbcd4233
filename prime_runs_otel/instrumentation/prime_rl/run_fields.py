"""What a prime-rl run is registered with: the fields ``PrimeMonitor.init``
reads from the orchestrator's config, in the terms of ``start_run``.

A field prime-rl leaves out is left out here too (team id and W&B project
are sent only when set), so the platform gets the same create request. A
config that cannot be read that way (another prime-rl version, a value
that is not JSON) costs that field, with a warning, never the training.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from ...semconv import FRAMEWORK_PRIME_RL

__all__ = [
    "API_BASE_ENV",
    "ATTACH_ENV",
    "LAUNCH_ID_ENV",
    "api_base_url",
    "run_config",
    "run_fields",
    "shared_run_id",
]

logger = logging.getLogger(__name__)

#: prime-rl's own variables: a managed launch's pre-created run (attach to
#: it), the RFT API root, and the launch id ``rl`` gives all its processes.
ATTACH_ENV = "RUN_ID"
API_BASE_ENV = "PRIME_API_BASE"
LAUNCH_ID_ENV = "PRL_RUN_ID"


def api_base_url() -> str | None:
    """``$PRIME_API_BASE`` (prime-rl's RFT root) as this package's base URL:
    the public root becomes its origin; the internal router of a hosted run
    stays as it is (``deliver/platform/rft.py`` reads it)."""
    raw = os.environ.get(API_BASE_ENV, "").strip().rstrip("/")
    if not raw:
        return None
    return raw.removesuffix("/rft") if raw.endswith("/api/v1/rft") else raw


def shared_run_id() -> str | None:
    """The run key every process of one ``rl`` launch shares, so the trainer's
    metrics join the orchestrator's run."""
    launch = os.environ.get(LAUNCH_ID_ENV, "").strip()
    return f"prime-rl-{launch}" if launch else None


def run_fields(name: str | None, config: Any) -> dict[str, Any]:
    """``start_run``'s fields for the orchestrator's run, as ``PrimeMonitor``
    reads them (its ``base_model`` is ``unknown`` without a config)."""
    fields: dict[str, Any] = {
        "kind": "train",
        "framework": FRAMEWORK_PRIME_RL,
        "name": name or None,
        "attach": os.environ.get(ATTACH_ENV) or None,
        "run_id": shared_run_id(),
        "model": "unknown",
        "max_steps": 0,
    }
    if config is None:
        return fields
    readers: dict[str, Callable[[], Any]] = {
        "model": lambda: str(config.model.name),
        "max_steps": lambda: int(config.max_steps or 0),
        "batch_size": lambda: config.batch_size,
        "rollouts_per_example": lambda: config.group_size,
        "seq_len": lambda: config.seq_len,
        "environments": lambda: [str(env.env_id) for env in config.train.source],
        "wandb_project": lambda: config.monitors.wandb.project if config.monitors.wandb else None,
    }
    for field, read in readers.items():
        try:
            value = read()
        except Exception as exc:  # another prime-rl's config: this field only
            logger.warning(
                "prime-rl run: its %s could not be read from the config (%s: %s); the run "
                "is registered without it",
                field,
                type(exc).__name__,
                exc,
            )
            continue
        if value is not None:
            fields[field] = value
    return fields


def run_config(config: Any) -> dict[str, Any]:
    """The run config as ``PrimeMonitor`` sends it (``model_dump(exclude_none=True,
    mode="json")``); empty, with a warning, when it cannot be written as JSON."""
    if config is None:
        return {}
    try:
        dumped = config.model_dump(exclude_none=True, mode="json")
        json.dumps(dumped, allow_nan=False)
    except Exception as exc:
        logger.warning(
            "prime-rl run: its config cannot be sent as JSON (%s: %s); the run is "
            "registered without it",
            type(exc).__name__,
            exc,
        )
        return {}
    return dumped if isinstance(dumped, dict) else {}
