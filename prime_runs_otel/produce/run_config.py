"""The run config as the platform stores it: a mapping, or the config file
the run was started from, byte for byte.

A file is read and checked when the run is started (missing, over the size
the prime SDKs accept, not UTF-8 text), so the user hears of it at once,
with what to do instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import semconv as sc
from ..errors import ConfigError

__all__ = ["MAX_CONFIG_SOURCE_BYTES", "normalize_config"]


#: A run config is display metadata, not a dataset: the platform stores it
#: with the run, and the prime SDKs refuse anything larger.
MAX_CONFIG_SOURCE_BYTES = 256 * 1024
_CONFIG_FORMATS = {".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def normalize_config(
    config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
    *,
    config_file: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """The run config as the platform stores it.

    A mapping is taken as given (copied). A path, through either argument, is
    read byte for byte into ``config_source`` so the dashboard shows the file
    the run was started from, comments included. Nothing is redacted: keep
    credentials in the environment, not in the config.
    """
    if config is None or isinstance(config, Mapping):
        normalized = dict(config or {})
    elif isinstance(config, (str, os.PathLike)):
        if config_file is not None:
            raise ConfigError(
                "config was given as a path and config_file too; pass the file once "
                "(config_file=...) and any extra fields as a mapping in config"
            )
        normalized, config_file = {}, config
    else:
        raise ConfigError(
            f"config must be a mapping or a path to a config file, got {type(config).__name__}"
        )
    if config_file is not None:
        normalized[sc.CONFIG_SOURCE_KEY] = _read_config_source(config_file)
    return normalized


def _read_config_source(path: str | os.PathLike[str]) -> dict[str, str]:
    resolved = Path(path)
    try:
        raw = resolved.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"config file {str(path)!r} does not exist; pass the path of the file "
            "the run was started from"
        ) from None
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r} could not be read: {exc}") from exc
    if len(raw) > MAX_CONFIG_SOURCE_BYTES:
        raise ConfigError(
            f"config file {str(path)!r} is {len(raw)} bytes, over the "
            f"{MAX_CONFIG_SOURCE_BYTES}-byte limit for a run config; pass the "
            "settings that matter as a mapping instead"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text ({exc.reason} at byte "
            f"{exc.start}); a run config must be readable text"
        ) from None
    return {
        "format": _CONFIG_FORMATS.get(resolved.suffix.lower(), "text"),
        "text": text,
        "filename": resolved.name,
    }
