"""The evaluations API: environments, runs, legacy samples, closing a run.

Each method is one request (environment resolution: one per environment), so
the uploader can persist its intent before each non-idempotent call.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .http import UPLOAD_TIMEOUT, PlatformClient, PlatformError

#: The API caps ``error_message``; longer text is cut, not rejected.
MAX_ERROR_MESSAGE = 4096

#: How the evaluations API spells a producer's terminal statuses. COMPLETED
#: only ever comes from ``/finalize``; a crash is a failure the process never
#: got to explain.
TERMINAL_STATUS = {"failed": "FAILED", "cancelled": "CANCELLED", "crashed": "FAILED"}


class EnvironmentResolutionError(PlatformError):
    """An environment that cannot be resolved: never skipped silently, since a
    run attached to the wrong environments looks like a successful upload."""


class EvalsAPI:
    def __init__(self, client: PlatformClient, *, frontend_url: str) -> None:
        self._client = client
        self._frontend_url = frontend_url.rstrip("/")

    def url_for(self, run_id: str) -> str:
        return f"{self._frontend_url}/dashboard/evaluations/{run_id}"

    def resolve_environment(self, reference: str) -> str:
        """A hub id for ``name`` (get-or-create, idempotent) or ``owner/name``."""
        try:
            if "/" in reference:
                owner, name = reference.split("/", 1)
                answer = self._client.request("GET", f"/environmentshub/{owner}/{name}/@latest")
                data = answer.get("data")
                found = (data if isinstance(data, dict) else answer).get("id")
            else:
                body: dict[str, Any] = {"name": reference}
                if self._client.team_id:
                    body["team_id"] = self._client.team_id
                answer = self._client.request("POST", "/environmentshub/resolve", body=body)
                found = (answer.get("data") or {}).get("id")
        except PlatformError as exc:
            if exc.retryable or exc.status in (401, 402, 403):
                raise  # an outage or a credential problem, not a wrong name
            raise EnvironmentResolutionError(
                f"environment {reference!r} could not be resolved ({exc}). Check the name "
                "(a hub name, or owner/name of a published environment) and your team",
                status=exc.status,
                code=exc.code,
            ) from exc
        if not found:
            raise EnvironmentResolutionError(
                f"the hub returned no id for environment {reference!r}"
            )
        return str(found)

    def create(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST /evaluations/``. Not replayable: a retry after a lost answer
        would make a second run; see :meth:`find_by_marker`."""
        answer = self._client.request("POST", "/evaluations/", body=payload)
        if not answer.get("evaluation_id"):
            raise PlatformError(
                f"POST /evaluations/ answered without an evaluation_id (keys: {sorted(answer)})"
            )
        return answer

    def list_runs(
        self, *, environment_name: str | None, pages: int, page_size: int = 100
    ) -> Iterator[dict[str, Any]]:
        """Runs newest first, a page at a time, for at most ``pages`` pages."""
        for page in range(pages):
            params: dict[str, Any] = {"skip": page * page_size, "limit": page_size}
            if environment_name:
                params["environment_name"] = environment_name
            if self._client.team_id:
                params["team_id"] = self._client.team_id
            answer = self._client.request("GET", "/evaluations/", params=params)
            runs = answer.get("evaluations") or []
            yield from (dict(run) for run in runs if isinstance(run, dict))
            if len(runs) < page_size:
                return

    def find_by_marker(
        self, *, marker_key: str, marker: str, environment_name: str | None
    ) -> dict[str, Any] | None:
        """The run whose metadata carries ``{marker_key: {"run_key": marker}}``.

        This is how a run whose create answer was lost is found again: the
        list is newest first and filtered by the run's first environment, so
        the first pages cover any create made while this run was being
        delivered.
        """
        for run in self.list_runs(environment_name=environment_name, pages=20):
            metadata = run.get("metadata")
            tag = metadata.get(marker_key) if isinstance(metadata, dict) else None
            if isinstance(tag, dict) and tag.get("run_key") == marker:
                return run
        return None

    def status_of(self, run_id: str, *, environment_name: str | None) -> str | None:
        """A run's status read back from the list endpoint (the public
        contract has no single-run read)."""
        for run in self.list_runs(environment_name=environment_name, pages=20):
            if run.get("evaluation_id") == run_id:
                return str(run.get("status") or "")
        return None

    def post_samples(self, run_id: str, body: bytes) -> None:
        """Appends rows: a replay after a lost answer would duplicate them."""
        self._client.request(
            "POST", f"/evaluations/{run_id}/samples", content=body, timeout=UPLOAD_TIMEOUT
        )

    def update(
        self, run_id: str, *, metadata: dict[str, Any] | None, metrics: dict[str, Any] | None
    ) -> None:
        """``PUT`` replaces the whole metadata document, so it is always sent whole."""
        body: dict[str, Any] = {}
        if metadata:
            body["metadata"] = metadata
        if metrics:
            body["metrics"] = metrics
        if body:
            self._client.request("PUT", f"/evaluations/{run_id}", body=body)

    def finalize(self, run_id: str, metrics: dict[str, Any] | None) -> None:
        """Not replayable: finalizing enqueues the platform's statistics task."""
        self._client.request(
            "POST", f"/evaluations/{run_id}/finalize", body={"metrics": metrics or {}}
        )

    def close_as(self, run_id: str, status: str, error: str | None) -> bool:
        """Mark a run FAILED/CANCELLED. ``False`` when it was already closed (409)."""
        body: dict[str, Any] = {"status": TERMINAL_STATUS[status]}
        message = f"crashed: {error}" if status == "crashed" and error else error
        if status == "crashed" and not message:
            message = "crashed"
        if message:
            body["error_message"] = message[:MAX_ERROR_MESSAGE]
        try:
            self._client.request("PUT", f"/evaluations/{run_id}", body=body)
        except PlatformError as exc:
            if exc.status == 409:
                return False
            raise
        return True


def first_environment_name(environments: Sequence[str]) -> str | None:
    """The platform's ``dataset`` field: the first environment's bare name."""
    for reference in environments:
        return reference.split("/", 1)[-1]
    return None
