"""The platform clients delivery talks through, made on first use.

Not made when the uploader starts: a process whose runs all stay local never
opens a connection, and an online run without an API key pauses with a
message that says how to set one (``push`` delivers it once there is one)
instead of failing the uploader's start. One set of clients serves every run
of the spool, so their connections are pooled across runs.
"""

from __future__ import annotations

import logging
import threading

from ..config import Settings, key_hint
from .backoff import Backoff
from .platform.evals import EvalsAPI
from .platform.http import PlatformClient, PlatformError
from .platform.rft import RftAPI
from .platform.traces import TracesAPI

logger = logging.getLogger(__name__)


class PlatformClients:
    """The evaluations, Prime Traces and RFT clients of one uploader; each
    getter raises :class:`~.backoff.Backoff` while there is no API key."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._platform: PlatformClient | None = None
        self._evals: EvalsAPI | None = None
        self._traces: TracesAPI | None = None
        self._rft: RftAPI | None = None

    def evals(self) -> EvalsAPI:
        return self._made()[0]

    def traces(self) -> TracesAPI:
        return self._made()[1]

    def rft(self) -> RftAPI:
        """The RFT client, addressed by the base URL (a hosted run's launcher
        hands its internal RFT root there)."""
        self._made()  # the same credential check, and the traces client a run needs
        with self._lock:
            if self._rft is None:
                settings = self._settings
                self._rft = RftAPI(
                    api_key=settings.api_key,
                    base_url=settings.base_url,
                    frontend_url=settings.frontend_url,
                    team_id=settings.team_id,
                )
            return self._rft

    def close(self) -> None:
        with self._lock:
            for client in (self._platform, self._traces, self._rft):
                if client is not None:
                    try:
                        client.close()
                    except Exception as exc:
                        logger.debug("closing a platform client failed: %s", exc)
            self._platform = self._traces = None
            self._evals = None
            self._rft = None

    def _made(self) -> tuple[EvalsAPI, TracesAPI]:
        with self._lock:
            if self._evals is None or self._traces is None:
                settings = self._settings
                if not settings.api_key:
                    raise Backoff(
                        PlatformError(
                            f"no API key: {key_hint()} to deliver online runs, or keep "
                            "them local with PRIME_RUNS_MODE=local",
                        ),
                        delay=max(settings.retry_max_delay, 1.0),
                    )
                self._platform = PlatformClient(
                    api_key=settings.api_key, base_url=settings.base_url, team_id=settings.team_id
                )
                self._evals = EvalsAPI(self._platform, frontend_url=settings.frontend_url)
                self._traces = TracesAPI(
                    api_key=settings.api_key,
                    traces_url=settings.traces_url,
                    team_id=settings.team_id,
                )
            return self._evals, self._traces
