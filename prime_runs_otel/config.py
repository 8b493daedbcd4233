"""Settings: where runs go, with what credentials, and how delivery behaves.

Precedence is argument → environment variable → ``~/.prime/config.json``, the
same as the prime CLI and SDKs, so a machine already logged in with ``prime
login`` needs no extra set-up. The platform-facing values are read through
``prime_traces.core.Config`` so the two packages can never disagree about a
credential or a URL.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from .errors import ConfigError

if TYPE_CHECKING:
    from prime_traces.core import Config as _PrimeConfig

Mode = Literal["online", "local", "disabled"]

MODE_ENV = "PRIME_RUNS_MODE"
DIR_ENV = "PRIME_RUNS_OTEL_DIR"
SPOOL_MAX_BYTES_ENV = "PRIME_RUNS_OTEL_SPOOL_MAX_BYTES"
FINISH_TIMEOUT_ENV = "PRIME_RUNS_OTEL_FINISH_TIMEOUT"
RETRY_MAX_DELAY_ENV = "PRIME_RUNS_OTEL_RETRY_MAX_DELAY"
TRACES_OPT_OUT_ENV = "PRIME_TRACES_OPT_OUT"
FRONTEND_URL_ENV = "PRIME_FRONTEND_URL"
KEEP_DELIVERED_ENV = "PRIME_RUNS_OTEL_KEEP_DELIVERED"

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


def spool_dir_setting(spool_dir: str | os.PathLike[str] | None = None) -> Path:
    """The spool folder: ``spool_dir`` if given, else ``PRIME_RUNS_OTEL_DIR``,
    else the default. Without the rest of :func:`resolve_settings`, whose
    platform settings cost the prime SDK's import: a command that only reads
    the local store does not pay for it."""
    return Path(spool_dir or os.environ.get(DIR_ENV) or default_spool_dir())


def spool_max_bytes_setting() -> int:
    """The spool's size cap (``PRIME_RUNS_OTEL_SPOOL_MAX_BYTES``), more than 0."""
    value = _env_int(SPOOL_MAX_BYTES_ENV, DEFAULT_SPOOL_MAX_BYTES)
    if value <= 0:
        raise ConfigError(
            f"{SPOOL_MAX_BYTES_ENV}={value} must be more than 0 bytes "
            f"(default {DEFAULT_SPOOL_MAX_BYTES}, 10 GiB)"
        )
    return value


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
    #: Whether delivered runs keep their episode bodies in the local store
    #: (for show, ui and export), until `prune`/`rm` or the size cap removes them.
    keep_delivered: bool = True

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

    @property
    def sends_prime_traces(self) -> bool:
        """Whether runs go to the platform as Prime Traces lines: what makes
        building each record's line where it is parsed worth its cost."""
        return self.mode == "online" and not self.traces_opt_out

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
    keep_delivered: bool | None = None,
) -> Settings:
    """Resolve settings; a malformed value raises :class:`ConfigError` naming it."""
    prime = _prime_config()
    key = api_key if api_key is not None else prime.api_key
    settings = Settings(
        mode=_resolve_mode(mode, has_key=bool(key)),
        api_key=key or "",
        base_url=_origin(base_url) if base_url else prime.base_url,
        traces_url=_origin(traces_url) if traces_url else prime.traces_url,
        frontend_url=(frontend_url or _frontend_url(prime)).rstrip("/"),
        team_id=team_id if team_id is not None else prime.team_id,
        traces_opt_out=(traces_opt_out if traces_opt_out is not None else _traces_opt_out(prime)),
        spool_dir=spool_dir_setting(spool_dir),
        spool_max_bytes=(
            spool_max_bytes if spool_max_bytes is not None else spool_max_bytes_setting()
        ),
        finish_timeout=(
            finish_timeout
            if finish_timeout is not None
            else _env_float(FINISH_TIMEOUT_ENV, DEFAULT_FINISH_TIMEOUT)
        ),
        retry_max_delay=_env_float(RETRY_MAX_DELAY_ENV, DEFAULT_RETRY_MAX_DELAY),
        keep_delivered=(
            keep_delivered
            if keep_delivered is not None
            else env_flag(KEEP_DELIVERED_ENV) is not False
        ),
    )
    _validate(settings)
    return settings


def refuse_overrides(settings: Settings | None, caller: str, **overrides: object) -> None:
    """A ``TypeError`` naming the settings given beside ``settings=``.

    Resolved ``Settings`` are final: an ``api_key=`` or ``mode=`` passed with
    them could only be ignored, and a run delivered with a key (or to a spool)
    other than the one asked for is a surprise found late. So both at once is
    refused, with what to do instead."""
    given = [name for name, value in overrides.items() if value is not None]
    if settings is None or not given:
        return
    named = ", ".join(f"{name}=" for name in given)
    example = f"dataclasses.replace(settings, {given[0]}=...)"
    raise TypeError(
        f"{caller}() got settings= and also {named}, which the settings would override: "
        f"put them in the settings ({example}), or leave settings= out"
    )


def _prime_config() -> _PrimeConfig:
    """The prime CLI's config, or a clear error naming a file that cannot be read
    (the SDK would otherwise fail later, or quietly use nothing)."""
    from prime_traces.core import Config

    path = Path.home() / ".prime" / "config.json"
    if path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"{path} cannot be read ({exc.strerror}); fix its permissions, or move it "
                "away and set PRIME_API_KEY instead"
            ) from None
        try:
            parsed = json.loads(text) if text.strip() else {}
        except ValueError as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc}); {config_fix_hint()}") from None
        if not isinstance(parsed, dict):
            raise ConfigError(f"{path} must hold a JSON object; {config_fix_hint()}")
    return Config()


def key_hint() -> str:
    """How to give an API key on this machine: ``prime login`` only where the
    ``prime`` command is installed (advice to run a missing command is a dead end)."""
    if shutil.which("prime"):
        return "set PRIME_API_KEY or run `prime login`"
    return "set PRIME_API_KEY"


def config_fix_hint() -> str:
    """How to repair a damaged ``~/.prime/config.json``."""
    if shutil.which("prime"):
        return "fix it with `prime login`, or move it away"
    return "move it away and set PRIME_API_KEY instead"


def _validate(settings: Settings) -> None:
    """Values that would misbehave far from where they were set are refused here."""
    for name, url in (
        ("PRIME_API_BASE_URL", settings.base_url),
        ("PRIME_TRACES_URL", settings.traces_url),
        (FRONTEND_URL_ENV, settings.frontend_url),
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"{name}={url!r} is not an http(s) URL: write it with its scheme, "
                "e.g. https://api.primeintellect.ai"
            )
    if settings.spool_max_bytes <= 0:
        raise ConfigError(
            f"{SPOOL_MAX_BYTES_ENV}={settings.spool_max_bytes} must be more than 0 bytes "
            f"(default {DEFAULT_SPOOL_MAX_BYTES}, 10 GiB)"
        )
    for name, seconds in (
        (FINISH_TIMEOUT_ENV, settings.finish_timeout),
        (RETRY_MAX_DELAY_ENV, settings.retry_max_delay),
    ):
        if not math.isfinite(seconds) or seconds < 0:
            raise ConfigError(f"{name}={seconds!r} must be a number of seconds, 0 or more")


def _resolve_mode(mode: str | None, *, has_key: bool) -> Mode:
    """Online with a key, local without one: no key never means lost runs."""
    raw = mode if mode is not None else os.environ.get(MODE_ENV, "")
    value = raw.strip().lower()
    if not value:
        return "online" if has_key else "local"
    if value == "online":
        if not has_key:
            raise ConfigError(
                f"{MODE_ENV}=online needs an API key: {key_hint()}, or use "
                "PRIME_RUNS_MODE=local to keep runs on this machine."
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


RESOURCE_ATTRIBUTES_ENV = "OTEL_RESOURCE_ATTRIBUTES"


def cut_resource_attributes(raw: str | None = None) -> list[str]:
    """Pieces of ``OTEL_RESOURCE_ATTRIBUTES`` that OpenTelemetry drops.

    The variable separates attributes with commas, so the second value of
    ``prime.run.environments=gsm8k,math`` reads as an attribute without ``=``
    and is dropped (the run keeps only ``gsm8k``). List values are written
    with ``%2C`` (URL-encoded, which the SDK decodes). Returns one message per
    dropped piece, saying how to write it.
    """
    text = os.environ.get(RESOURCE_ATTRIBUTES_ENV, "") if raw is None else raw
    messages = []
    previous: str | None = None
    for piece in text.split(","):
        if "=" in piece:
            previous = piece.split("=", 1)[0].strip()
            continue
        if not piece.strip():
            continue
        fix = (
            f"; write {previous}=...%2C{piece.strip()} to keep it in {previous}" if previous else ""
        )
        messages.append(
            f"{RESOURCE_ATTRIBUTES_ENV}: {piece.strip()!r} has no '=' and is dropped: commas "
            f"separate attributes{fix}"
        )
    return messages
