"""The RFT API's external training runs, and the bucket behind its presigned
sample URLs.

A training run belongs to a team (``allowed_teams`` limits which) or, created
without one (as prime-rl does when no team is configured), to its user's own
account; it keeps one metrics row per step (a replayed step replaces its row,
every posted row is kept in arrival order too), and closes through
its status or ``/finalize``, which succeeds on a run that is closed already.
Step sample objects go through presign → PUT → confirm: the PUT reaches the
bucket without a token (the signature in the URL is the grant), and a
confirm is only accepted for an object presigned for that run and step.
"""

from __future__ import annotations

import copy
import re
import secrets
import uuid
from typing import Protocol
from urllib.parse import quote, unquote

from ._fields import environment_refs, optional_object, optional_str, required_int, required_str
from ._http import (
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
from ._store import FakeRun, FakeStepSamples, Store, new_id


class Platform(Protocol):
    """What the RFT API reads of the platform it is part of."""

    @property
    def url(self) -> str: ...

    allowed_teams: set[str] | None


class TrainingRuns:
    def __init__(self, store: Store, platform: Platform) -> None:
        self._store = store
        self._platform = platform

    def routes(self) -> list[Route]:
        return [
            route("POST", r"/api/v1/rft/external-runs", self._create),
            route("GET", rf"/api/v1/rft/external-runs/{RUN_ID}", self._get),
            route("PUT", rf"/api/v1/rft/external-runs/{RUN_ID}/status", self._status),
            route("POST", r"/api/v1/rft/metrics", self._metrics_row),
            route("POST", r"/api/v1/rft/finalize", self._finalize),
            route("POST", r"/api/v1/rft/samples/presign", self._presign_samples),
            route("POST", r"/api/v1/rft/samples/confirm", self._confirm_samples),
            route("PUT", r"/storage/(?P<key>.+)", self._store_object, "storage"),
        ]

    def _create(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        team_id = optional_str(body, "team_id")
        allowed_teams = self._platform.allowed_teams
        if team_id is not None and allowed_teams is not None and team_id not in allowed_teams:
            raise detail(403, f"team {team_id} is not enabled for external training runs")
        base_model = required_str(body, "base_model")
        required_int(body, "max_steps")
        run_id = new_id("run_")
        run = FakeRun(
            id=run_id,
            name=optional_str(body, "name") or f"{base_model.rsplit('/', 1)[-1]}-{run_id[-6:]}",
            kind="train",
            create_payload=body,
            metadata=copy.deepcopy(optional_object(body, "run_config") or {}),
            environments=environment_refs(body.get("environments", []), required=False),
            team_id=team_id,
        )
        with self._store.lock:
            self._store.runs[run.id] = run
        return json_response(201, {"run": {"id": run.id, "name": run.name}})

    def _get(self, request: Request, match: re.Match[str]) -> Response:
        with self._store.lock:
            run = self._training_run(match["run_id"])
            view = {
                "id": run.id,
                "name": run.name,
                "status": run.status.lower(),
                "error_message": run.error_message,
                "team_id": run.team_id,
                "created_at": run.created_at.isoformat(),
            }
        return json_response(200, {"run": view})

    def _status(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        status = body.get("status")
        if status not in ("completed", "failed"):
            raise unprocessable(f"`status` must be completed or failed, got {status!r}")
        error_message = optional_str(body, "error_message")
        with self._store.lock:
            run = self._training_run(match["run_id"])
            self._store.close_run(
                run, "COMPLETED" if status == "completed" else "FAILED", error_message
            )
        return json_response(200, {"run": {"id": run.id, "status": status}})

    def _metrics_row(self, request: Request, match: re.Match[str]) -> Response:
        """One row per step: a replayed step replaces its row rather than adding one."""
        body = request.json_object()
        metrics = optional_object(body, "metrics")
        if metrics is None:
            raise unprocessable("`metrics` is required")
        with self._store.lock:
            run = self._training_run(required_str(body, "run_id"))
            rows = self._store.training_metrics.setdefault(run.id, [])
            _upsert_step(rows, copy.deepcopy(metrics))
            self._store.metrics_posts.setdefault(run.id, []).append(copy.deepcopy(metrics))
        return json_response(200, {"run_id": run.id, "step": metrics.get("step")})

    def _finalize(self, request: Request, match: re.Match[str]) -> Response:
        """Compare-and-set: finalizing a run that is already closed is a success."""
        body = request.json_object()
        exit_code = body.get("exit_code", 0)
        with self._store.lock:
            run = self._training_run(required_str(body, "run_id"))
            run.finalize_calls += 1
            run.finalize_bodies.append(copy.deepcopy(body))
            if not run.closed:
                run.status = "COMPLETED" if exit_code == 0 else "FAILED"
            return json_response(200, {"run_id": run.id, "status": run.status.lower()})

    def _presign_samples(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        step = required_int(body, "step")
        with self._store.lock:
            run = self._training_run(required_str(body, "run_id"))
            key = f"rft/{run.id}/step-{step}/{uuid.uuid4().hex}.parquet"
            signature = secrets.token_hex(16)
            self._store.presigned[key] = (signature, run.id, step)
        url = f"{self._platform.url}/storage/{quote(key)}?signature={signature}"
        return json_response(200, {"data": {"presignedUrl": url, "s3Key": key}})

    def _store_object(self, request: Request, match: re.Match[str]) -> Response:
        """The bucket behind presigned URLs: no bearer token, the signature is the grant."""
        key = unquote(match["key"])
        with self._store.lock:
            grant = self._store.presigned.get(key)
            if grant is None or request.param("signature") != grant[0]:
                return Response(403, b"AccessDenied: the signature does not match", "text/plain")
            self._store.objects[key] = request.body
        return Response(200)

    def _confirm_samples(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        step = required_int(body, "step")
        key = required_str(body, "s3_key")
        with self._store.lock:
            run = self._training_run(required_str(body, "run_id"))
            grant = self._store.presigned.get(key)
            if grant is None or grant[1:] != (run.id, step):
                raise detail(400, f"{key} was not presigned for run {run.id} step {step}")
            data = self._store.objects.get(key)
            if data is None:
                raise not_found(f"object {key}")
            confirmed = self._store.step_samples.setdefault(run.id, [])
            if all(existing.s3_key != key for existing in confirmed):
                confirmed.append(FakeStepSamples(run.id, step, key, data))
        return json_response(200, {"status": "confirmed", "s3_key": key})

    def _training_run(self, run_id: str) -> FakeRun:
        run = self._store.runs.get(run_id)
        if run is None or run.kind != "train":
            raise not_found(f"Run {run_id}")
        return run


def _upsert_step(rows: list[JSONObject], row: JSONObject) -> None:
    step = row.get("step")
    for index, existing in enumerate(rows):
        if step is not None and existing.get("step") == step:
            rows[index] = row
            return
    rows.append(row)
