"""The RFT API: external training runs, their step metrics, step sample tables
and closing them.

Each method is one request, so the uploader can persist its intent before
each call that is not safe to replay (only :meth:`RftAPI.create` is not).

A training run is reached through one of two roots. A run this process
registers, or one it attaches to by id from outside the platform, lives under
the public API (``{origin}/api/v1/rft/...``). A *hosted* run is reached
through the platform's internal RFT router, whose root its launcher hands the
trainer as the base URL (``{origin}/api/internal/rft``): that router
authenticates the run's own token from ``x-api-key`` and serves attached runs
only. :func:`split_api_root` tells the two apart from the base URL's path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from ...errors import ConfigError
from .http import (
    DEFAULT_TIMEOUT,
    UPLOAD_TIMEOUT,
    PlatformError,
    classify_transport_error,
    encode_json,
    send_once,
    tls_context,
    user_agent,
)

__all__ = [
    "INTERNAL_API_PATH",
    "PUBLIC_API_PATH",
    "RftAPI",
    "TrainingFields",
    "external_run_payload",
    "split_api_root",
    "status_body",
]

PUBLIC_API_PATH = "/api/v1"
INTERNAL_API_PATH = "/api/internal"

#: Roots a base URL may end in, longest first. ``/rft`` counts only after an
#: API path, so a host that happens to be called ``rft`` is never cut.
_API_ROOTS = (
    ("/api/internal/rft", INTERNAL_API_PATH),
    ("/api/internal", INTERNAL_API_PATH),
    ("/api/v1/rft", PUBLIC_API_PATH),
    ("/api/v1", PUBLIC_API_PATH),
)

#: The RFT API knows ``completed`` and ``failed`` only; the finer reason for a
#: failure travels in ``error_message``.
_RFT_STATUS = {
    "completed": "completed",
    "failed": "failed",
    "cancelled": "failed",
    "crashed": "failed",
}


def split_api_root(base_url: str) -> tuple[str, str]:
    """``(origin, api_path)`` for a platform origin or one of its API roots.

    Only the path is inspected: ``https://host/api/internal/rft`` is the
    internal router of ``https://host``, anything without a known root is an
    origin served under the public ``/api/v1``.
    """
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    api_path = PUBLIC_API_PATH
    for suffix, root in _API_ROOTS:
        if path.endswith(suffix):
            path, api_path = path[: -len(suffix)], root
            break
    origin = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return origin.rstrip("/"), api_path


@dataclass(frozen=True)
class TrainingFields:
    """What a training run is registered with besides its model, environments
    and team. ``max_steps`` is required by the API; 0 says it is unknown."""

    max_steps: int = 0
    batch_size: int | None = None
    rollouts_per_example: int | None = None
    seq_len: int | None = None
    wandb_project: str | None = None
    wandb_entity: str | None = None
    wandb_run_name: str | None = None


def external_run_payload(
    *,
    base_model: str | None,
    team_id: str | None,
    environments: Sequence[str],
    training: TrainingFields,
    name: str | None = None,
    run_config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The body of ``POST /rft/external-runs``.

    Raises :class:`ConfigError` for what the API would refuse anyway, with
    what to set instead. ``team_id`` is sent only when set, as prime-rl
    sends it: a run without one belongs to its user's own account.
    """
    if not base_model:
        raise ConfigError(
            "a training run needs its base model: pass model=... to start_run() or set "
            "prime.run.model on the Resource"
        )
    if training.max_steps < 0:
        raise ConfigError(f"max_steps must be 0 (unknown) or more, got {training.max_steps}")
    # In the order prime-rl's PrimeMonitor writes them, so that its runs
    # registered through this package are the same request, byte for byte.
    fields: dict[str, Any] = {
        "base_model": base_model,
        "max_steps": int(training.max_steps),
        "batch_size": training.batch_size,
        "rollouts_per_example": training.rollouts_per_example,
        "seq_len": training.seq_len,
        # Passed through as given: the RFT API resolves hub names itself.
        "environments": [{"id": reference} for reference in environments],
        "run_config": dict(run_config) if run_config else None,
        "wandb_project": training.wandb_project,
        "wandb_entity": training.wandb_entity,
        "wandb_run_name": training.wandb_run_name,
        "name": name,
        "team_id": team_id or None,
    }
    return {key: value for key, value in fields.items() if value is not None}


def status_body(status: str, error: str | None) -> dict[str, Any]:
    """``PUT /rft/external-runs/{id}/status`` for a producer's terminal status.

    Anything but a plain failure says what it was in the message (``crashed:
    ...``, ``cancelled: ...``), since the API itself only knows ``failed``.
    """
    if status not in _RFT_STATUS:
        raise ValueError(f"status={status!r} is not one of {', '.join(_RFT_STATUS)}")
    body: dict[str, Any] = {"status": _RFT_STATUS[status]}
    if status == "completed":
        if error:
            body["error_message"] = error
        return body
    message = error or status
    if status != "failed":
        message = f"{status}: {message}"
    body["error_message"] = message
    return body


class RftAPI:
    """One request per method against the RFT API (public or internal root)."""

    def __init__(
        self, *, api_key: str, base_url: str, frontend_url: str, team_id: str | None = None
    ) -> None:
        origin, api_path = split_api_root(base_url)
        self.team_id = team_id
        #: Addressing a hosted run through the internal router.
        self.internal = api_path == INTERNAL_API_PATH
        self._frontend_url = frontend_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}", "User-Agent": user_agent()}
        if self.internal:
            # The internal router reads a hosted run's own token from this header.
            headers["x-api-key"] = api_key
        self._client = httpx.Client(
            base_url=f"{origin}{api_path}",
            headers=headers,
            timeout=DEFAULT_TIMEOUT,
            verify=tls_context(),
        )
        # Presigned URLs carry their own grant and refuse the platform's credentials.
        self._storage = httpx.Client(
            headers={"User-Agent": user_agent()},
            follow_redirects=False,
            timeout=UPLOAD_TIMEOUT,
            verify=tls_context(),
        )

    def url_for(self, run_id: str) -> str:
        return f"{self._frontend_url}/dashboard/training/{run_id}"

    # -- the run ------------------------------------------------------------------

    def create(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /rft/external-runs`` → ``{"id", "name"}`` of the new run.

        Not replayable: a retry after a lost answer would register a second
        run, and the API has no way to find the first one again.
        """
        answer = self._request("POST", "/rft/external-runs", body=payload)
        run = answer.get("run")
        if not isinstance(run, dict) or not run.get("id"):
            raise PlatformError(
                f"POST /rft/external-runs answered without a run id (keys: {sorted(answer)})"
            )
        return {"id": str(run["id"]), "name": run.get("name")}

    def status_of(self, run_id: str) -> str | None:
        """The run's status as the platform reports it (lower case), if it says."""
        answer = self._request("GET", f"/rft/external-runs/{run_id}")
        run = answer.get("run")
        status = (run if isinstance(run, dict) else answer).get("status")
        return str(status).lower() if status else None

    def finalize(self, run_id: str, *, as_prime_rl: bool = False) -> None:
        """``POST /rft/finalize``: a clean exit. Compare-and-set on the server,
        so a replay is harmless, and a run that is already closed (409) counts
        as finalized.

        The documented body is ``{run_id, exit_code: 0}``; prime-rl's own
        monitor posts ``{run_id, summary: {}}``, and a run that stands in for
        that monitor (``as_prime_rl``) posts the same, so the platform sees
        the request it would see without this package."""
        ending: dict[str, object] = {"summary": {}} if as_prime_rl else {"exit_code": 0}
        body = {"run_id": run_id, **ending}
        try:
            self._request("POST", "/rft/finalize", body=body)
        except PlatformError as exc:
            if exc.status != 409:
                raise

    def set_status(self, run_id: str, status: str, error: str | None = None) -> bool:
        """Close the run as ``status``. ``False`` when it was already closed (409)."""
        try:
            self._request(
                "PUT", f"/rft/external-runs/{run_id}/status", body=status_body(status, error)
            )
        except PlatformError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    # -- step metrics -------------------------------------------------------------

    def post_metrics(self, run_id: str, row: Mapping[str, Any]) -> None:
        """One step's metrics row. Replayable: the platform keeps one row per
        step, so a duplicate collapses while a lost row is a hole for good."""
        self._request("POST", "/rft/metrics", body={"run_id": run_id, "metrics": dict(row)})

    # -- step sample tables ---------------------------------------------------------

    def presign_samples(self, run_id: str, step: int) -> tuple[str, str]:
        """``(upload URL, object key)`` for one Parquet object of ``step``.
        Replayable: a presign only mints a URL."""
        answer = self._request(
            "POST", "/rft/samples/presign", body={"run_id": run_id, "step": int(step)}
        )
        nested = answer.get("data")
        data: dict[str, Any] = nested if isinstance(nested, dict) else answer
        url = data.get("presignedUrl") or data.get("presigned_url")
        key = data.get("s3Key") or data.get("s3_key")
        if not url or not key:
            raise PlatformError(
                f"POST /rft/samples/presign answered without an upload URL and key "
                f"(keys: {sorted(data)})"
            )
        return str(url), str(key)

    def put_samples(self, url: str, data: bytes) -> None:
        """PUT the Parquet bytes to storage. Idempotent: the key is the object."""
        what = "PUT of the step sample table"
        try:
            response = self._storage.put(
                url, content=data, headers={"Content-Type": "application/parquet"}
            )
        except httpx.RequestError as exc:
            raise classify_transport_error(exc, what) from exc
        if response.is_success:
            return
        status = response.status_code
        retryable = status >= 500 or status == 429
        raise PlatformError(
            f"{what} answered {status}: {response.text[:200]!r}",
            status=status,
            retryable=retryable,
            ambiguous=retryable and status not in (429, 503),
        )

    def confirm_samples(self, run_id: str, step: int, key: str) -> None:
        """Register an uploaded object with its step. Replayable: it validates
        the key and refreshes the run's progress."""
        self._request(
            "POST",
            "/rft/samples/confirm",
            body={"run_id": run_id, "step": int(step), "s3_key": key},
        )

    # -- plumbing -------------------------------------------------------------------

    def _request(self, method: str, path: str, *, body: Any = None) -> dict[str, Any]:
        what = f"{method} {path}"
        data = None if body is None else encode_json(body)
        headers = {"Content-Type": "application/json"} if data is not None else None
        return send_once(
            lambda: self._client.request(method, path.lstrip("/"), content=data, headers=headers),
            what,
        )

    def close(self) -> None:
        self._client.close()
        self._storage.close()
