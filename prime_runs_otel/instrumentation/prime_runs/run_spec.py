"""What ``prime_runs.init(...)`` was asked for: its arguments, checked as
prime-runs checks them and put in the terms of this package's run.

A caller of the patched ``init`` must see the same refusals, with the same
exception types, as with prime-runs itself; after that, the run is named
by ``run_resource``'s fields, whichever pipeline delivers it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import prime_runs as pr

from ...errors import PrimeRunsOtelError
from ...produce.run_config import normalize_config

__all__ = ["RunSpec", "run_mode"]


class RunSpec:
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
    def from_init(cls, kwargs: Mapping[str, Any]) -> RunSpec:
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


def run_mode(mode: Any) -> str | None:
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
