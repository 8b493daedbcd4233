"""The evaluations API: eval runs and their legacy sample table.

Strict where the platform is: a run needs at least one resolved environment,
a status update may only close a run (and a closed run stays closed: the
whole update is refused with 409), ``PUT`` replaces the metadata document
rather than merging it, the list endpoint pages and filters the way the
client's lookup of a lost create depends on, and one samples request has a
size ceiling.
"""

from __future__ import annotations

import copy
import re
from typing import Protocol, cast

from ._fields import environment_refs, optional_object, optional_str, query_int, required_str
from ._http import (
    MIB,
    RUN_ID,
    JSONObject,
    Request,
    Response,
    Route,
    detail,
    json_response,
    not_found,
    route,
    unprocessable,
)
from ._store import FakeRun, RunStatus, Store, new_id

#: The evaluations API's ceiling on one ``POST /samples`` request.
MAX_SAMPLES_REQUEST_BYTES = 25 * MIB
#: ``UpdateEvaluationRequest.error_message`` is capped server-side.
MAX_ERROR_MESSAGE_CHARS = 4096


class Platform(Protocol):
    """What the evaluations API reads of the platform it is part of."""

    @property
    def url(self) -> str: ...

    max_samples_request_bytes: int


class Evaluations:
    def __init__(self, store: Store, platform: Platform) -> None:
        self._store = store
        self._platform = platform

    def routes(self) -> list[Route]:
        return [
            route("POST", r"/api/v1/evaluations/?", self._create),
            route("GET", r"/api/v1/evaluations/?", self._list),
            route("GET", rf"/api/v1/evaluations/{RUN_ID}", self._get),
            route("PUT", rf"/api/v1/evaluations/{RUN_ID}", self._update),
            route("POST", rf"/api/v1/evaluations/{RUN_ID}/finalize", self._finalize),
            route("POST", rf"/api/v1/evaluations/{RUN_ID}/samples", self._push_samples),
        ]

    def _create(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        name = required_str(body, "name")
        environments = environment_refs(body.get("environments"), required=True)
        metadata = optional_object(body, "metadata") or {}
        run = FakeRun(
            id=new_id("eval_"),
            name=name,
            kind="eval",
            create_payload=body,
            metadata=copy.deepcopy(metadata),
            environments=environments,
            team_id=optional_str(body, "team_id"),
        )
        with self._store.lock:
            self._store.runs[run.id] = run
        return json_response(
            201,
            {
                "evaluation_id": run.id,
                "name": run.name,
                "viewer_url": self._viewer_url(run),
                "status": run.status,
            },
        )

    def _list(self, request: Request, match: re.Match[str]) -> Response:
        environment_name = request.param("environment_name")
        team_id = request.param("team_id")
        skip = query_int(request, "skip", 0)
        limit = query_int(request, "limit", 50)
        with self._store.lock:
            matching = [
                run
                for run in reversed(self._store.runs.values())
                if run.kind == "eval"
                and (team_id is None or run.team_id == team_id)
                and (environment_name is None or environment_name in self._names_of(run))
            ]
            page = [self._view(run) for run in matching[skip : skip + limit]]
        return json_response(
            200, {"evaluations": page, "total": len(matching), "skip": skip, "limit": limit}
        )

    def _get(self, request: Request, match: re.Match[str]) -> Response:
        with self._store.lock:
            return json_response(200, self._view(self._evaluation(match["run_id"])))

    def _update(self, request: Request, match: re.Match[str]) -> Response:
        """A status closes the run (409 when it is already closed, which rejects
        the whole update); ``metadata`` replaces the document, ``metrics`` too."""
        body = request.json_object()
        status = body.get("status")
        if status is not None and status not in ("FAILED", "CANCELLED"):
            raise unprocessable(f"`status` must be FAILED or CANCELLED, got {status!r}")
        error_message = _error_message(body)
        metadata = optional_object(body, "metadata")
        metrics = optional_object(body, "metrics")
        with self._store.lock:
            run = self._evaluation(match["run_id"])
            if status is not None:
                self._store.close_run(run, cast(RunStatus, status), error_message)
            if metadata is not None:
                run.metadata = copy.deepcopy(metadata)
            if metrics is not None:
                run.metrics = copy.deepcopy(metrics)
            return json_response(200, self._view(run))

    def _finalize(self, request: Request, match: re.Match[str]) -> Response:
        metrics = optional_object(request.json_object(), "metrics")
        with self._store.lock:
            run = self._evaluation(match["run_id"])
            run.finalize_calls += 1
            if run.closed:
                raise detail(409, f"Evaluation {run.id} is already {run.status}")
            run.status = "COMPLETED"
            if metrics:
                run.metrics = copy.deepcopy(metrics)
        return json_response(200, {"evaluation_id": run.id, "status": run.status})

    def _push_samples(self, request: Request, match: re.Match[str]) -> Response:
        ceiling = self._platform.max_samples_request_bytes
        if len(request.body) > ceiling:
            raise detail(413, f"a samples request is limited to {ceiling} bytes")
        samples = request.json_object().get("samples")
        if not isinstance(samples, list) or not all(isinstance(row, dict) for row in samples):
            raise unprocessable("`samples` must be a list of objects")
        with self._store.lock:
            run = self._evaluation(match["run_id"])
            self._store.samples.setdefault(run.id, []).extend(samples)
        return json_response(200, {"samples_pushed": len(samples)})

    def _evaluation(self, run_id: str) -> FakeRun:
        run = self._store.runs.get(run_id)
        if run is None or run.kind != "eval":
            raise not_found(f"Evaluation {run_id}")
        return run

    def _names_of(self, run: FakeRun) -> set[str]:
        names = {self._store.environment_names.get(entry["id"], "") for entry in run.environments}
        dataset = run.create_payload.get("dataset")
        if isinstance(dataset, str):
            names.add(dataset)
        return names - {""}

    def _viewer_url(self, run: FakeRun) -> str:
        return f"{self._platform.url}/dashboard/evaluations/{run.id}"

    def _view(self, run: FakeRun) -> JSONObject:
        payload = run.create_payload
        return {
            "evaluation_id": run.id,
            "name": run.name,
            "status": run.status,
            "metadata": copy.deepcopy(run.metadata),
            "metrics": copy.deepcopy(run.metrics),
            "created_at": run.created_at.isoformat(),
            "environments": copy.deepcopy(run.environments),
            "environment_names": sorted(self._names_of(run)),
            "model_name": payload.get("model_name"),
            "dataset": payload.get("dataset"),
            "framework": payload.get("framework"),
            "tags": copy.deepcopy(payload.get("tags") or []),
            "team_id": run.team_id,
            "error_message": run.error_message,
            "total_samples": len(self._store.samples.get(run.id, [])),
            "viewer_url": self._viewer_url(run),
        }


def _error_message(body: JSONObject) -> str | None:
    message = optional_str(body, "error_message")
    if message is not None and len(message) > MAX_ERROR_MESSAGE_CHARS:
        raise unprocessable(f"`error_message` exceeds {MAX_ERROR_MESSAGE_CHARS} characters")
    return message
