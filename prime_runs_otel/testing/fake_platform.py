"""A fake Prime platform: a real HTTP server on loopback speaking the wire contract.

Tests of an exporter are only as good as the server they talk to, so this one is
strict where the platform is strict (bearer token, idempotency digest over the
uncompressed bytes, run id read from every member trace, request limits, the run
status guard) and records everything it was sent, so a test can assert what the
platform *stored* rather than what a client *meant* to send. Faults are injected
at the HTTP level (error statuses, gateway failures after the work was done, a
closed listening socket, latency) because the delivery code under test has to
survive exactly those.

One origin serves the platform API (``/api/v1/...``), the Prime Traces service
(``POST /api/v1/traces``), and the object storage behind presigned sample URLs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import errno
import html
import json
import re
import secrets
import shlex
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, cast
from urllib.parse import quote, unquote

from prime_traces.models import ErrorCode

from ._http import (
    MIB,
    JSONObject,
    Reject,
    Request,
    Response,
    Server,
    coded,
    detail,
    json_response,
    not_found,
    unprocessable,
)
from ._traces_upload import Document, Limits, LineFormat, Upload, decode_upload, parse_documents

#: Prime Traces limits, defined over the uncompressed bytes.
MAX_LINE_BYTES = 64 * MIB
MAX_UPLOAD_BYTES = 256 * MIB
MAX_UPLOAD_LINES = 1_000_000
#: The evaluations API's ceiling on one ``POST /samples`` request.
MAX_SAMPLES_REQUEST_BYTES = 25 * MIB
#: ``UpdateEvaluationRequest.error_message`` is capped server-side.
MAX_ERROR_MESSAGE_CHARS = 4096

RECORDED_HEADERS = (
    "content-type",
    "content-length",
    "idempotency-key",
    "x-prime-line-format",
    "x-prime-team-id",
    "user-agent",
)

RunStatus = Literal["RUNNING", "COMPLETED", "FAILED", "CANCELLED"]
RunKind = Literal["eval", "train"]


# -- what the platform stored ---------------------------------------------------------


@dataclass
class FakeRun:
    """One run as the platform holds it. ``status_updates`` keeps every status
    change that was asked for, with the HTTP status it was answered with, so a
    test can tell a rejected second close from one that never came."""

    id: str
    name: str
    kind: RunKind
    create_payload: JSONObject
    status: RunStatus = "RUNNING"
    metadata: JSONObject = field(default_factory=dict)
    metrics: JSONObject = field(default_factory=dict)
    error_message: str | None = None
    environments: list[JSONObject] = field(default_factory=list)
    team_id: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    finalize_calls: int = 0
    status_updates: list[JSONObject] = field(default_factory=list)

    @property
    def closed(self) -> bool:
        return self.status != "RUNNING"


@dataclass
class FakeUpload:
    """One committed Prime Traces upload. ``replays`` counts later requests with
    the same bytes that were answered from this receipt instead of stored."""

    id: str
    line_format: LineFormat
    context: dict[str, str]
    num_lines: int
    schema_version: int
    run_ids: list[str | None]
    record_ids: list[str]
    team_id: str | None
    compressed: bool
    size_bytes: int
    received_at: float
    replays: int = 0


@dataclass(frozen=True)
class FakeStepSamples:
    """A confirmed training-step sample object (the bytes the client PUT)."""

    run_id: str
    step: int
    s3_key: str
    data: bytes


@dataclass(frozen=True)
class RecordedRequest:
    """One request as received. ``fault`` names the injected fault that
    answered it (``"fail"``, ``"ambiguous"``), if any."""

    method: str
    path: str
    query: str
    status: int
    headers: dict[str, str]
    received_at: float
    body_bytes: int
    fault: str | None = None


# -- injected faults ---------------------------------------------------------------------


@dataclass
class _Fault:
    kind: Literal["fail", "ambiguous"]
    remaining: int
    status: int
    method: str | None
    path: re.Pattern[str] | None
    retry_after: float | None
    code: str | None

    def matches(self, request: Request) -> bool:
        if self.method is not None and self.method != request.method:
            return False
        return self.path is None or self.path.search(request.path) is not None

    def response(self) -> Response:
        headers = {} if self.retry_after is None else {"Retry-After": f"{self.retry_after:g}"}
        if self.kind == "ambiguous":
            # A gateway that lost the upstream answer: no service envelope, no code.
            return Response(502, b"502 Bad Gateway", "text/plain", headers)
        if self.code is not None:
            message = f"injected fault: HTTP {self.status}"
            return json_response(
                self.status, {"error": {"code": self.code, "message": message}}, headers
            )
        return json_response(
            self.status, {"detail": f"injected fault: HTTP {self.status}"}, headers
        )


# -- reading platform API request bodies -------------------------------------------------


def _required_str(body: JSONObject, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise unprocessable(f"`{key}` is required and must be a non-empty string")
    return value


def _optional_str(body: JSONObject, key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise unprocessable(f"`{key}` must be a string")
    return value


def _optional_object(body: JSONObject, key: str) -> JSONObject | None:
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise unprocessable(f"`{key}` must be a JSON object")
    return value


def _required_int(body: JSONObject, key: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise unprocessable(f"`{key}` is required and must be an integer")
    return value


def _environment_refs(value: Any, *, required: bool) -> list[JSONObject]:
    if not isinstance(value, list) or (required and not value):
        raise unprocessable("`environments` must be a list of {id} objects with at least one entry")
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) or not entry["id"]:
            raise unprocessable(f"environment reference {entry!r} has no string `id`")
    return [dict(entry) for entry in value]


def _error_message(body: JSONObject) -> str | None:
    message = _optional_str(body, "error_message")
    if message is not None and len(message) > MAX_ERROR_MESSAGE_CHARS:
        raise unprocessable(f"`error_message` exceeds {MAX_ERROR_MESSAGE_CHARS} characters")
    return message


def _query_int(request: Request, name: str, default: int) -> int:
    raw = request.param(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise unprocessable(f"query parameter `{name}` must be an integer") from exc
    if value < 0:
        raise unprocessable(f"query parameter `{name}` must not be negative")
    return value


def _upsert_step(rows: list[JSONObject], row: JSONObject) -> None:
    step = row.get("step")
    for index, existing in enumerate(rows):
        if step is not None and existing.get("step") == step:
            rows[index] = row
            return
    rows.append(row)


def _page(title: str, body: str) -> bytes:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)} · fake Prime platform</title></head>"
        f"<body>{body}<p>Served by prime-runs-otel's fake platform.</p></body></html>"
    ).encode()


def _new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:20]}"


_RouteHandler = Callable[[Request, "re.Match[str]"], Response]
#: Which part of the platform a route belongs to (and how it authenticates).
_Service = Literal["api", "traces", "storage", "dashboard"]


@dataclass(frozen=True)
class _Route:
    method: str
    pattern: re.Pattern[str]
    handle: _RouteHandler
    #: ``api`` answers auth failures in the platform API's shape, ``traces`` in
    #: the service envelope; ``storage`` is the presigned-URL bucket (no token).
    service: _Service = "api"


# -- the platform ------------------------------------------------------------------------


class FakePlatform:
    """The Prime platform on ``127.0.0.1``: eval runs, environments, Prime Traces
    uploads and external training runs, with faults on demand.

    Use it as a context manager, point a client at :meth:`client_env`, and read
    back what was stored with :meth:`runs`, :meth:`episodes`, :meth:`samples`
    and :attr:`uploads`. Every accessor returns a copy taken under the lock, so
    a test can read while uploads are still arriving.
    """

    def __init__(
        self,
        *,
        api_key: str = "test-key",
        host: str = "127.0.0.1",
        port: int = 0,
        allowed_teams: set[str] | None = None,
    ) -> None:
        self.api_key = api_key
        self.allowed_teams = None if allowed_teams is None else set(allowed_teams)
        #: When true, uploads are refused with 403 ``service_not_enabled``, as for
        #: an account that is not on Prime Traces.
        self.service_not_enabled = False
        #: Called with every recorded request (the CLI logs through it).
        self.on_request: Callable[[RecordedRequest], None] | None = None
        self.max_line_bytes = MAX_LINE_BYTES
        self.max_upload_bytes = MAX_UPLOAD_BYTES
        self.max_upload_lines = MAX_UPLOAD_LINES
        self.max_samples_request_bytes = MAX_SAMPLES_REQUEST_BYTES

        self._host = host
        self._port = port
        self._lock = threading.RLock()
        self._server_lock = threading.Lock()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._outage = False
        self._latency = 0.0
        self._faults: list[_Fault] = []

        self._runs: dict[str, FakeRun] = {}
        self._samples: dict[str, list[JSONObject]] = {}
        self._training_metrics: dict[str, list[JSONObject]] = {}
        self._step_samples: dict[str, list[FakeStepSamples]] = {}
        self._named_environments: dict[tuple[str | None, str], str] = {}
        self._published_environments: dict[str, str] = {}
        self._environment_names: dict[str, str] = {}
        self._uploads: dict[str, FakeUpload] = {}
        self._episodes: dict[str | None, dict[str, JSONObject]] = {}
        self._traces: dict[str | None, dict[str, JSONObject]] = {}
        self._deliveries: dict[tuple[str | None, str], int] = {}
        self._presigned: dict[str, tuple[str, str, int]] = {}
        self._objects: dict[str, bytes] = {}
        self._requests: list[RecordedRequest] = []
        self._routes = self._build_routes()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> FakePlatform:
        with self._server_lock:
            if self._server is None and not self._outage:
                self._open(self._port)
        return self

    def stop(self) -> None:
        with self._server_lock:
            self._close()
            self._outage = False

    def __enter__(self) -> FakePlatform:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if not self._port:
            raise RuntimeError("the fake platform has no port yet; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """The origin serving the API, Prime Traces, storage and the dashboard."""
        host = "127.0.0.1" if self._host in ("", "0.0.0.0") else self._host
        return f"http://{host}:{self.port}"

    def client_env(self) -> dict[str, str]:
        """Environment variables that point prime-runs / prime-traces clients here."""
        return {
            "PRIME_API_KEY": self.api_key,
            "PRIME_API_BASE_URL": self.url,
            "PRIME_TRACES_URL": self.url,
            "PRIME_FRONTEND_URL": self.url,
        }

    def _open(self, port: int) -> None:
        server = self._bind(port)
        self._port = int(server.server_address[1])
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-platform-{self._port}",
            daemon=True,
        )
        thread.start()
        self._server, self._thread = server, thread

    def _bind(self, port: int) -> Server:
        """Reopening after an outage must get the same port back; a socket from
        the previous server may take a moment to release it."""
        deadline = time.monotonic() + 5.0
        while True:
            try:
                return Server((self._host, port), self._serve)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or not port or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _close(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.drop_connections()
        if thread is not None:
            thread.join(timeout=5.0)

    # -- faults ----------------------------------------------------------------------

    def fail_next(
        self,
        count: int,
        *,
        status: int = 503,
        method: str | None = None,
        path: str | None = None,
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        """Answer the next ``count`` matching requests with ``status`` without
        acting on them. ``path`` is a regex searched in the request path;
        ``code`` switches the body to the service envelope with that code."""
        self._add_fault("fail", count, status, method, path, retry_after, code)

    def ambiguous_next(
        self,
        count: int,
        *,
        method: str | None = None,
        path: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        """Perform the next ``count`` matching requests, then answer 502 as a
        gateway that lost the response would: the client cannot tell whether
        the work was done."""
        self._add_fault("ambiguous", count, 502, method, path, retry_after, None)

    def _add_fault(
        self,
        kind: Literal["fail", "ambiguous"],
        count: int,
        status: int,
        method: str | None,
        path: str | None,
        retry_after: float | None,
        code: str | None,
    ) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        fault = _Fault(
            kind=kind,
            remaining=count,
            status=status,
            method=method.upper() if method else None,
            path=re.compile(path) if path is not None else None,
            retry_after=retry_after,
            code=code,
        )
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, request: Request) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.matches(request):
                    fault.remaining -= 1
                    return fault
            return None

    def start_outage(self) -> None:
        """Close the listening socket and every open connection: clients get
        connection refused until :meth:`end_outage` reopens the same port."""
        with self._server_lock:
            if self._server is None:
                raise RuntimeError("the fake platform is not running; start() it first")
            self._close()
            self._outage = True

    def end_outage(self) -> None:
        with self._server_lock:
            if not self._outage:
                return
            self._open(self._port)
            self._outage = False

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        self.start_outage()
        try:
            yield
        finally:
            self.end_outage()

    def set_latency(self, seconds: float) -> None:
        """Delay every later request by ``seconds`` before it is handled."""
        if seconds < 0:
            raise ValueError("latency cannot be negative")
        with self._lock:
            self._latency = float(seconds)

    # -- setup -----------------------------------------------------------------------

    def add_environment(self, owner: str, name: str) -> str:
        """Publish ``owner/name`` on the hub so ``@latest`` resolves it; returns its id."""
        with self._lock:
            slug = f"{owner}/{name}"
            environment_id = self._published_environments.get(slug)
            if environment_id is None:
                environment_id = _new_id("env_")
                self._published_environments[slug] = environment_id
                self._environment_names[environment_id] = name
            return environment_id

    # -- what was received -----------------------------------------------------------

    def runs(self) -> list[FakeRun]:
        with self._lock:
            return copy.deepcopy(list(self._runs.values()))

    def run(self, run_id: str) -> FakeRun:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                known = ", ".join(self._runs) or "none"
                raise KeyError(f"no run {run_id!r} on the fake platform (runs: {known})")
            return copy.deepcopy(run)

    def episodes(self, run_id: str) -> list[JSONObject]:
        """Episode lines stored for ``run_id`` (read from ``trace.run.id``), in
        arrival order, each episode id once (a later copy replaces the record)."""
        with self._lock:
            return copy.deepcopy(list(self._episodes.get(run_id, {}).values()))

    def traces(self, run_id: str) -> list[JSONObject]:
        """Bare trace lines stored for ``run_id``, each trace id once."""
        with self._lock:
            return copy.deepcopy(list(self._traces.get(run_id, {}).values()))

    def episode_deliveries(self, run_id: str) -> dict[str, int]:
        """How many distinct committed uploads carried each episode of ``run_id``;
        more than one means the producer sent the same episode twice."""
        with self._lock:
            return {
                episode_id: count
                for (stored_run, episode_id), count in self._deliveries.items()
                if stored_run == run_id
            }

    def samples(self, run_id: str) -> list[JSONObject]:
        """Legacy v0 sample rows pushed to the evaluation, in arrival order."""
        with self._lock:
            return copy.deepcopy(self._samples.get(run_id, []))

    def training_metrics(self, run_id: str) -> list[JSONObject]:
        """One row per step (a repeated step replaces its row), in arrival order."""
        with self._lock:
            return copy.deepcopy(self._training_metrics.get(run_id, []))

    def training_samples(self, run_id: str) -> list[FakeStepSamples]:
        with self._lock:
            return list(self._step_samples.get(run_id, []))

    def environments(self) -> dict[str, str]:
        """Every environment id the hub knows, with its name."""
        with self._lock:
            return dict(self._environment_names)

    @property
    def uploads(self) -> list[FakeUpload]:
        """Committed Prime Traces uploads, in commit order."""
        with self._lock:
            return copy.deepcopy(list(self._uploads.values()))

    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    # -- dispatch --------------------------------------------------------------------

    def _serve(self, request: Request) -> Response:
        with self._lock:
            latency = self._latency
        if latency:
            time.sleep(latency)
        fault = self._take_fault(request)
        if fault is not None and fault.kind == "fail":
            response = fault.response()
        else:
            response = self._act(request)
            if fault is not None:
                response = fault.response()
        self._record(request, response, fault)
        return response

    def _act(self, request: Request) -> Response:
        try:
            route, match = self._route(request)
            self._authenticate(route, request)
            return route.handle(request, match)
        except Reject as rejection:
            return rejection.response
        except Exception as exc:  # a bug in the fake must read as one, not as a dropped socket
            traceback.print_exc()
            return json_response(
                500, {"detail": f"fake platform error: {type(exc).__name__}: {exc}"}
            )

    def _route(self, request: Request) -> tuple[_Route, re.Match[str]]:
        allowed: list[str] = []
        for route in self._routes:
            match = route.pattern.match(request.path)
            if match is None:
                continue
            if route.method == request.method:
                return route, match
            allowed.append(route.method)
        if allowed:
            raise Reject(
                json_response(405, {"detail": "Method Not Allowed"}, {"Allow": ", ".join(allowed)})
            )
        raise not_found(f"{request.method} {request.path}")

    def _authenticate(self, route: _Route, request: Request) -> None:
        if route.service in ("storage", "dashboard"):
            return
        if request.header("Authorization") == f"Bearer {self.api_key}":
            return
        message = "missing or invalid API key"
        if route.service == "traces":
            raise coded(401, ErrorCode.UNAUTHENTICATED, message)
        raise detail(401, message)

    def _record(self, request: Request, response: Response, fault: _Fault | None) -> None:
        recorded = RecordedRequest(
            method=request.method,
            path=request.path,
            query=request.query,
            status=response.status,
            headers={
                name: request.headers[name] for name in RECORDED_HEADERS if name in request.headers
            },
            received_at=time.time(),
            body_bytes=len(request.body),
            fault=fault.kind if fault is not None else None,
        )
        with self._lock:
            self._requests.append(recorded)
        hook = self.on_request
        if hook is not None:
            hook(recorded)

    def _build_routes(self) -> list[_Route]:
        run = r"(?P<run_id>[^/]+)"
        table: list[
            tuple[str, str, _RouteHandler, Literal["api", "traces", "storage", "dashboard"]]
        ] = [
            ("POST", r"/api/v1/environmentshub/resolve", self._resolve_environment, "api"),
            (
                "GET",
                r"/api/v1/environmentshub/(?P<owner>[^/]+)/(?P<name>[^/]+)/@latest",
                self._latest_environment,
                "api",
            ),
            ("POST", r"/api/v1/evaluations/?", self._create_evaluation, "api"),
            ("GET", r"/api/v1/evaluations/?", self._list_evaluations, "api"),
            ("GET", rf"/api/v1/evaluations/{run}", self._get_evaluation, "api"),
            ("PUT", rf"/api/v1/evaluations/{run}", self._update_evaluation, "api"),
            ("POST", rf"/api/v1/evaluations/{run}/finalize", self._finalize_evaluation, "api"),
            ("POST", rf"/api/v1/evaluations/{run}/samples", self._push_samples, "api"),
            ("POST", r"/api/v1/traces", self._upload_traces, "traces"),
            ("POST", r"/api/v1/rft/external-runs", self._create_training_run, "api"),
            ("GET", rf"/api/v1/rft/external-runs/{run}", self._get_training_run, "api"),
            ("PUT", rf"/api/v1/rft/external-runs/{run}/status", self._training_status, "api"),
            ("POST", r"/api/v1/rft/metrics", self._training_metrics_row, "api"),
            ("POST", r"/api/v1/rft/finalize", self._finalize_training_run, "api"),
            ("POST", r"/api/v1/rft/samples/presign", self._presign_samples, "api"),
            ("POST", r"/api/v1/rft/samples/confirm", self._confirm_samples, "api"),
            ("PUT", r"/storage/(?P<key>.+)", self._store_object, "storage"),
            (
                "GET",
                rf"/dashboard/(?:evaluations|training)/{run}",
                self._dashboard_page,
                "dashboard",
            ),
        ]
        return [
            _Route(method, re.compile(f"^{pattern}$"), handler, service)
            for method, pattern, handler, service in table
        ]

    # -- the dashboard ---------------------------------------------------------------

    def _dashboard_page(self, request: Request, match: re.Match[str]) -> Response:
        """The viewer URL a run is given answers with a small page: what the
        fake platform holds for the run (the real dashboard is not faked)."""
        run_id = match["run_id"]
        with self._lock:
            run = copy.deepcopy(self._runs.get(run_id))
            episodes = len(self._episodes.get(run_id, {}))
            samples = len(self._samples.get(run_id, []))
        if run is None:
            body = f"<h1>no run {html.escape(run_id)} on this fake platform</h1>"
            return Response(404, _page("run not found", body), "text/html; charset=utf-8")
        rows = "".join(
            f"<tr><th>{html.escape(label)}</th><td>{html.escape(str(value))}</td></tr>"
            for label, value in (
                ("id", run.id),
                ("name", run.name),
                ("kind", run.kind),
                ("status", run.status),
                ("episodes (Prime Traces)", episodes),
                ("sample rows", samples),
                ("metrics", json.dumps(run.metrics, sort_keys=True)),
                ("error", run.error_message or ""),
            )
        )
        body = f"<h1>{html.escape(run.name)}</h1><table>{rows}</table>"
        return Response(200, _page(run.name, body), "text/html; charset=utf-8")

    # -- environments ----------------------------------------------------------------

    def _resolve_environment(self, request: Request, match: re.Match[str]) -> Response:
        """Get-or-create by name within a team: a replay returns the same id."""
        body = request.json_object()
        name = _required_str(body, "name")
        team_id = _optional_str(body, "team_id")
        with self._lock:
            environment_id = self._named_environments.get((team_id, name))
            if environment_id is None:
                environment_id = _new_id("env_")
                self._named_environments[(team_id, name)] = environment_id
                self._environment_names[environment_id] = name
        return json_response(200, {"data": {"id": environment_id, "name": name}})

    def _latest_environment(self, request: Request, match: re.Match[str]) -> Response:
        slug = f"{match['owner']}/{match['name']}"
        with self._lock:
            environment_id = self._published_environments.get(slug)
        if environment_id is None:
            raise not_found(f"Environment {slug}")
        return json_response(200, {"data": {"id": environment_id, "name": match["name"]}})

    # -- evaluations -----------------------------------------------------------------

    def _create_evaluation(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        name = _required_str(body, "name")
        environments = _environment_refs(body.get("environments"), required=True)
        metadata = _optional_object(body, "metadata") or {}
        run = FakeRun(
            id=_new_id("eval_"),
            name=name,
            kind="eval",
            create_payload=body,
            metadata=copy.deepcopy(metadata),
            environments=environments,
            team_id=_optional_str(body, "team_id"),
        )
        with self._lock:
            self._runs[run.id] = run
        return json_response(
            201,
            {
                "evaluation_id": run.id,
                "name": run.name,
                "viewer_url": f"{self.url}/dashboard/evaluations/{run.id}",
                "status": run.status,
            },
        )

    def _list_evaluations(self, request: Request, match: re.Match[str]) -> Response:
        environment_name = request.param("environment_name")
        team_id = request.param("team_id")
        skip = _query_int(request, "skip", 0)
        limit = _query_int(request, "limit", 50)
        with self._lock:
            matching = [
                run
                for run in reversed(self._runs.values())
                if run.kind == "eval"
                and (team_id is None or run.team_id == team_id)
                and (environment_name is None or environment_name in self._names_of(run))
            ]
            page = [self._evaluation_view(run) for run in matching[skip : skip + limit]]
        return json_response(
            200, {"evaluations": page, "total": len(matching), "skip": skip, "limit": limit}
        )

    def _get_evaluation(self, request: Request, match: re.Match[str]) -> Response:
        with self._lock:
            return json_response(200, self._evaluation_view(self._evaluation(match["run_id"])))

    def _update_evaluation(self, request: Request, match: re.Match[str]) -> Response:
        """A status closes the run (409 when it is already closed, which rejects
        the whole update); ``metadata`` replaces the document, ``metrics`` too."""
        body = request.json_object()
        status = body.get("status")
        if status is not None and status not in ("FAILED", "CANCELLED"):
            raise unprocessable(f"`status` must be FAILED or CANCELLED, got {status!r}")
        error_message = _error_message(body)
        metadata = _optional_object(body, "metadata")
        metrics = _optional_object(body, "metrics")
        with self._lock:
            run = self._evaluation(match["run_id"])
            if status is not None:
                self._close_run(run, cast(RunStatus, status), error_message)
            if metadata is not None:
                run.metadata = copy.deepcopy(metadata)
            if metrics is not None:
                run.metrics = copy.deepcopy(metrics)
            return json_response(200, self._evaluation_view(run))

    def _finalize_evaluation(self, request: Request, match: re.Match[str]) -> Response:
        metrics = _optional_object(request.json_object(), "metrics")
        with self._lock:
            run = self._evaluation(match["run_id"])
            run.finalize_calls += 1
            if run.closed:
                raise detail(409, f"Evaluation {run.id} is already {run.status}")
            run.status = "COMPLETED"
            if metrics:
                run.metrics = copy.deepcopy(metrics)
        return json_response(200, {"evaluation_id": run.id, "status": run.status})

    def _push_samples(self, request: Request, match: re.Match[str]) -> Response:
        if len(request.body) > self.max_samples_request_bytes:
            raise detail(
                413, f"a samples request is limited to {self.max_samples_request_bytes} bytes"
            )
        samples = request.json_object().get("samples")
        if not isinstance(samples, list) or not all(isinstance(row, dict) for row in samples):
            raise unprocessable("`samples` must be a list of objects")
        with self._lock:
            run = self._evaluation(match["run_id"])
            self._samples.setdefault(run.id, []).extend(samples)
        return json_response(200, {"samples_pushed": len(samples)})

    def _evaluation(self, run_id: str) -> FakeRun:
        run = self._runs.get(run_id)
        if run is None or run.kind != "eval":
            raise not_found(f"Evaluation {run_id}")
        return run

    def _close_run(self, run: FakeRun, status: RunStatus, error_message: str | None) -> None:
        """The status guard: a closed run stays closed."""
        update: JSONObject = {"status": status, "error_message": error_message}
        run.status_updates.append(update)
        if run.closed:
            update["answered"] = 409
            raise detail(409, f"Run {run.id} is already {run.status}")
        update["answered"] = 200
        run.status = status
        run.error_message = error_message

    def _names_of(self, run: FakeRun) -> set[str]:
        names = {self._environment_names.get(entry["id"], "") for entry in run.environments}
        dataset = run.create_payload.get("dataset")
        if isinstance(dataset, str):
            names.add(dataset)
        return names - {""}

    def _evaluation_view(self, run: FakeRun) -> JSONObject:
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
            "total_samples": len(self._samples.get(run.id, [])),
            "viewer_url": f"{self.url}/dashboard/evaluations/{run.id}",
        }

    # -- Prime Traces ----------------------------------------------------------------

    def _upload_traces(self, request: Request, match: re.Match[str]) -> Response:
        """Content-addressed and all-or-nothing: validated in full before
        anything is stored, and the same bytes again replay the receipt."""
        if self.service_not_enabled:
            raise coded(
                403,
                ErrorCode.SERVICE_NOT_ENABLED,
                "Prime Traces is not enabled for this account",
            )
        limits = Limits(self.max_line_bytes, self.max_upload_bytes, self.max_upload_lines)
        upload = decode_upload(request, limits)
        with self._lock:
            if upload.digest in self._uploads:
                return self._replay(upload)
        documents = parse_documents(upload, limits)
        with self._lock:
            if upload.digest in self._uploads:
                return self._replay(upload)
            self._commit(upload, documents)
        return json_response(201, {"upload_id": upload.digest, "status": "committed"})

    def _replay(self, upload: Upload) -> Response:
        committed = self._uploads[upload.digest]
        if committed.line_format != upload.line_format:
            raise coded(
                409,
                ErrorCode.LINE_FORMAT_CONFLICT,
                f"upload {upload.digest} was committed as {committed.line_format} lines; "
                f"it cannot be replayed as {upload.line_format} lines",
            )
        committed.replays += 1
        return json_response(201, {"upload_id": committed.id, "status": "committed"})

    def _commit(self, upload: Upload, documents: list[Document]) -> None:
        store = self._episodes if upload.line_format == "episode" else self._traces
        for document in documents:
            store.setdefault(document.run_id, {})[document.id] = document.record
            if upload.line_format == "episode":
                key = (document.run_id, document.id)
                self._deliveries[key] = self._deliveries.get(key, 0) + 1
        self._uploads[upload.digest] = FakeUpload(
            id=upload.digest,
            line_format=upload.line_format,
            context=dict(upload.context),
            num_lines=len(documents),
            schema_version=upload.schema_version,
            run_ids=list(dict.fromkeys(document.run_id for document in documents)),
            record_ids=[document.id for document in documents],
            team_id=upload.team_id,
            compressed=upload.compressed,
            size_bytes=len(upload.data),
            received_at=time.time(),
        )

    # -- external training runs (RFT) ------------------------------------------------

    def _create_training_run(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        team_id = _optional_str(body, "team_id")
        if not team_id:
            raise unprocessable("`team_id` is required: external training runs belong to a team")
        if self.allowed_teams is not None and team_id not in self.allowed_teams:
            raise detail(403, f"team {team_id} is not enabled for external training runs")
        base_model = _required_str(body, "base_model")
        _required_int(body, "max_steps")
        run_id = _new_id("run_")
        run = FakeRun(
            id=run_id,
            name=_optional_str(body, "name") or f"{base_model.rsplit('/', 1)[-1]}-{run_id[-6:]}",
            kind="train",
            create_payload=body,
            metadata=copy.deepcopy(_optional_object(body, "run_config") or {}),
            environments=_environment_refs(body.get("environments", []), required=False),
            team_id=team_id,
        )
        with self._lock:
            self._runs[run.id] = run
        return json_response(201, {"run": {"id": run.id, "name": run.name}})

    def _get_training_run(self, request: Request, match: re.Match[str]) -> Response:
        with self._lock:
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

    def _training_status(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        status = body.get("status")
        if status not in ("completed", "failed"):
            raise unprocessable(f"`status` must be completed or failed, got {status!r}")
        error_message = _optional_str(body, "error_message")
        with self._lock:
            run = self._training_run(match["run_id"])
            self._close_run(run, "COMPLETED" if status == "completed" else "FAILED", error_message)
        return json_response(200, {"run": {"id": run.id, "status": status}})

    def _training_metrics_row(self, request: Request, match: re.Match[str]) -> Response:
        """One row per step: a replayed step replaces its row rather than adding one."""
        body = request.json_object()
        metrics = _optional_object(body, "metrics")
        if metrics is None:
            raise unprocessable("`metrics` is required")
        with self._lock:
            run = self._training_run(_required_str(body, "run_id"))
            _upsert_step(self._training_metrics.setdefault(run.id, []), copy.deepcopy(metrics))
        return json_response(200, {"run_id": run.id, "step": metrics.get("step")})

    def _finalize_training_run(self, request: Request, match: re.Match[str]) -> Response:
        """Compare-and-set: finalizing a run that is already closed is a success."""
        body = request.json_object()
        exit_code = body.get("exit_code", 0)
        with self._lock:
            run = self._training_run(_required_str(body, "run_id"))
            run.finalize_calls += 1
            if not run.closed:
                run.status = "COMPLETED" if exit_code == 0 else "FAILED"
            return json_response(200, {"run_id": run.id, "status": run.status.lower()})

    def _presign_samples(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        step = _required_int(body, "step")
        with self._lock:
            run = self._training_run(_required_str(body, "run_id"))
            key = f"rft/{run.id}/step-{step}/{uuid.uuid4().hex}.parquet"
            signature = secrets.token_hex(16)
            self._presigned[key] = (signature, run.id, step)
        url = f"{self.url}/storage/{quote(key)}?signature={signature}"
        return json_response(200, {"data": {"presignedUrl": url, "s3Key": key}})

    def _store_object(self, request: Request, match: re.Match[str]) -> Response:
        """The bucket behind presigned URLs: no bearer token, the signature is the grant."""
        key = unquote(match["key"])
        with self._lock:
            grant = self._presigned.get(key)
            if grant is None or request.param("signature") != grant[0]:
                return Response(403, b"AccessDenied: the signature does not match", "text/plain")
            self._objects[key] = request.body
        return Response(200)

    def _confirm_samples(self, request: Request, match: re.Match[str]) -> Response:
        body = request.json_object()
        step = _required_int(body, "step")
        key = _required_str(body, "s3_key")
        with self._lock:
            run = self._training_run(_required_str(body, "run_id"))
            grant = self._presigned.get(key)
            if grant is None or grant[1:] != (run.id, step):
                raise detail(400, f"{key} was not presigned for run {run.id} step {step}")
            data = self._objects.get(key)
            if data is None:
                raise not_found(f"object {key}")
            confirmed = self._step_samples.setdefault(run.id, [])
            if all(existing.s3_key != key for existing in confirmed):
                confirmed.append(FakeStepSamples(run.id, step, key, data))
        return json_response(200, {"status": "confirmed", "s3_key": key})

    def _training_run(self, run_id: str) -> FakeRun:
        run = self._runs.get(run_id)
        if run is None or run.kind != "train":
            raise not_found(f"Run {run_id}")
        return run


# -- command line ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m prime_runs_otel.testing",
        description=(
            "Serve a fake Prime platform (evaluations, environments, Prime Traces, "
            "training runs) so a run can be tried end to end without an account."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free port)")
    parser.add_argument("--api-key", default="test-key", help="the bearer token to accept")
    parser.add_argument(
        "--allowed-team",
        action="append",
        default=None,
        help="a team allowed to create training runs (repeatable; default: every team)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    return parser


def _log_request(recorded: RecordedRequest) -> None:
    fault = f" [{recorded.fault}]" if recorded.fault else ""
    print(
        f"{recorded.method} {recorded.path} -> {recorded.status}{fault}",
        file=sys.stderr,
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until Ctrl-C, after printing the exports that point a client here."""
    args = _parser().parse_args(argv)
    platform = FakePlatform(
        api_key=args.api_key,
        host=args.host,
        port=args.port,
        allowed_teams=set(args.allowed_team) if args.allowed_team else None,
    )
    if not args.quiet:
        platform.on_request = _log_request
    with platform:
        print(f"# Fake Prime platform at {platform.url}; point a client at it with:")
        for name, value in platform.client_env().items():
            print(f"export {name}={shlex.quote(value)}")
        print("# Press Ctrl-C to stop.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0
