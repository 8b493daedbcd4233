"""Settings: where runs go, with what credentials, and how delivery behaves.

Precedence is argument → environment variable → ``~/.prime/config.json``, the
same as the prime CLI and SDKs, so a machine already logged in with ``prime
login`` needs no extra set-up. The platform-facing values are read through
``prime_traces.core.Config`` so the two packages can never disagree about a
credential or a URL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from prime_traces.core import Config as _PrimeConfig

from .errors import ConfigError

Mode = Literal["online", "local", "disabled"]

MODE_ENV = "PRIME_RUNS_MODE"
DIR_ENV = "PRIME_RUNS_OTEL_DIR"
SPOOL_MAX_BYTES_ENV = "PRIME_RUNS_OTEL_SPOOL_MAX_BYTES"
FINISH_TIMEOUT_ENV = "PRIME_RUNS_OTEL_FINISH_TIMEOUT"
RETRY_MAX_DELAY_ENV = "PRIME_RUNS_OTEL_RETRY_MAX_DELAY"
TRACES_OPT_OUT_ENV = "PRIME_TRACES_OPT_OUT"
FRONTEND_URL_ENV = "PRIME_FRONTEND_URL"

DEFAULT_FRONTEND_URL = "https://app.primeintellect.ai"
#: 10 GiB: far beyond any single eval, small enough to notice a stuck uploader.
DEFAULT_SPOOL_MAX_BYTES = 10 * 1024**3
#: A slow platform must not hold a finished eval hostage; what is left stays
#: in the spool for ``prime-runs-otel push``.
DEFAULT_FINISH_TIMEOUT = 300.0
#: Backoff between delivery attempts grows to this cap and stays there for as
#: long as the run lives: an outage pauses delivery, it never ends it.
DEFAULT_RETRY_MAX_DELAY = 60.0

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def default_spool_dir() -> Path:
    """The spool lives beside the prime CLI's own config, one per user."""
    return Path.home() / ".prime" / "runs-otel"


@dataclass(frozen=True)
class Settings:
    """Everything the exporter needs to know, resolved once at start-up.

    ``api_key`` is kept out of ``repr`` so a logged settings object never
    leaks the credential.
    """

    mode: Mode
    base_url: str
    traces_url: str
    frontend_url: str
    team_id: str | None
    traces_opt_out: bool
    spool_dir: Path
    spool_max_bytes: int
    finish_timeout: float
    retry_max_delay: float
    api_key: str = ""

    def __repr__(self) -> str:
        key = "set" if self.api_key else "missing"
        return (
            f"Settings(mode={self.mode!r}, base_url={self.base_url!r}, "
            f"traces_url={self.traces_url!r}, team_id={self.team_id!r}, "
            f"spool_dir={str(self.spool_dir)!r}, api_key={key})"
        )

    @property
    def spool_path(self) -> Path:
        return self.spool_dir / "spool.sqlite3"

    def with_mode(self, mode: Mode) -> Settings:
        return replace(self, mode=mode)


def resolve_settings(
    *,
    api_key: str | None = None,
    base_url: str | None = None,
    traces_url: str | None = None,
    frontend_url: str | None = None,
    team_id: str | None = None,
    traces_opt_out: bool | None = None,
    mode: str | None = None,
    spool_dir: str | os.PathLike[str] | None = None,
    spool_max_bytes: int | None = None,
    finish_timeout: float | None = None,
) -> Settings:
    """Resolve settings; a malformed value raises :class:`ConfigError` naming it."""
    prime = _PrimeConfig()
    key = api_key if api_key is not None else prime.api_key
    return Settings(
        mode=_resolve_mode(mode, has_key=bool(key)),
        api_key=key or "",
        base_url=_origin(base_url) if base_url else prime.base_url,
        traces_url=_origin(traces_url) if traces_url else prime.traces_url,
        frontend_url=(frontend_url or _frontend_url(prime)).rstrip("/"),
        team_id=team_id if team_id is not None else prime.team_id,
        traces_opt_out=(traces_opt_out if traces_opt_out is not None else _traces_opt_out(prime)),
        spool_dir=Path(spool_dir or os.environ.get(DIR_ENV) or default_spool_dir()),
        spool_max_bytes=(
            spool_max_bytes
            if spool_max_bytes is not None
            else _env_int(SPOOL_MAX_BYTES_ENV, DEFAULT_SPOOL_MAX_BYTES)
        ),
        finish_timeout=(
            finish_timeout
            if finish_timeout is not None
            else _env_float(FINISH_TIMEOUT_ENV, DEFAULT_FINISH_TIMEOUT)
        ),
        retry_max_delay=_env_float(RETRY_MAX_DELAY_ENV, DEFAULT_RETRY_MAX_DELAY),
    )


def _resolve_mode(mode: str | None, *, has_key: bool) -> Mode:
    """Online with a key, local without one: no key never means lost runs."""
    raw = mode if mode is not None else os.environ.get(MODE_ENV, "")
    value = raw.strip().lower()
    if not value:
        return "online" if has_key else "local"
    if value == "online":
        if not has_key:
            raise ConfigError(
                f"{MODE_ENV}=online needs an API key: set PRIME_API_KEY or run "
                "`prime login`, or use PRIME_RUNS_MODE=local to keep runs on this machine."
            )
        return "online"
    if value == "local":
        return "local"
    if value == "disabled":
        return "disabled"
    raise ConfigError(f"{MODE_ENV}={raw!r} is not one of online, local or disabled")


def _origin(url: str) -> str:
    return url.rstrip("/").removesuffix("/api/v1")


def _frontend_url(prime: _PrimeConfig) -> str:
    value = os.environ.get(FRONTEND_URL_ENV) or prime.config.get("frontend_url")
    return str(value or DEFAULT_FRONTEND_URL)


def _traces_opt_out(prime: _PrimeConfig) -> bool:
    raw = os.environ.get(TRACES_OPT_OUT_ENV)
    if raw is not None and raw.strip():
        return _parse_bool(TRACES_OPT_OUT_ENV, raw)
    value = prime.config.get("traces_opt_out", False)
    if isinstance(value, str):
        return _parse_bool("traces_opt_out in ~/.prime/config.json", value)
    return bool(value)


def env_flag(name: str) -> bool | None:
    """A true/false environment variable; ``None`` when it is unset or empty."""
    raw = os.environ.get(name)
    return _parse_bool(name, raw) if raw is not None and raw.strip() else None


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not one of true or false")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number of bytes") from None


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
