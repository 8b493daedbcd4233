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

This module is the server and what a test sees of it: starting, stopping and
cutting it off, routing and authenticating each request, recording it, and
reading back what was stored. What each service does with a request is in
its own module: ``_evaluations.py``, ``_environments.py``,
``_prime_traces.py``, ``_training.py`` (RFT and the storage bucket),
``_dashboard.py``; what they store is in ``_store.py``, the faults in
``_faults.py``.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterator

from prime_traces.models import ErrorCode

from ._dashboard import Dashboard
from ._environments import EnvironmentsHub
from ._evaluations import MAX_SAMPLES_REQUEST_BYTES, Evaluations
from ._faults import Fault, Faults
from ._http import (
    JSONObject,
    Reject,
    Request,
    Response,
    Route,
    Server,
    coded,
    detail,
    json_response,
    not_found,
)
from ._prime_traces import MAX_LINE_BYTES, MAX_UPLOAD_BYTES, MAX_UPLOAD_LINES, PrimeTraces
from ._store import FakeRun, FakeStepSamples, FakeUpload, RecordedRequest, Store
from ._training import TrainingRuns

RECORDED_HEADERS = (
    "content-type",
    "content-length",
    "idempotency-key",
    "x-prime-line-format",
    "x-prime-team-id",
    "user-agent",
)


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
        #: When false, Prime Traces refuses (409) an upload with episodes of a
        #: run that is closed already; the real service's choice is its own.
        self.closed_runs_take_episodes = True
        #: Called with every recorded request (the CLI logs through it).
        self.on_request: Callable[[RecordedRequest], None] | None = None
        self.max_line_bytes = MAX_LINE_BYTES
        self.max_upload_bytes = MAX_UPLOAD_BYTES
        self.max_upload_lines = MAX_UPLOAD_LINES
        self.max_samples_request_bytes = MAX_SAMPLES_REQUEST_BYTES

        self._host = host
        self._port = port
        self._server_lock = threading.Lock()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._outage = False
        #: A server ran here before: a restart waits for its port to be released.
        self._served = False
        self._faults = Faults()

        self._store = Store()
        self._environments = EnvironmentsHub(self._store)
        self._routes: list[Route] = [
            *self._environments.routes(),
            *Evaluations(self._store, self).routes(),
            *PrimeTraces(self._store, self).routes(),
            *TrainingRuns(self._store, self).routes(),
            *Dashboard(self._store).routes(),
        ]

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> FakePlatform:
        with self._server_lock:
            if self._server is None and not self._outage:
                self._open(self._port, reopening=self._served)
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

    def _open(self, port: int, *, reopening: bool = False) -> None:
        server = self._bind(port, reopening=reopening)
        self._port = int(server.server_address[1])
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-platform-{self._port}",
            daemon=True,
        )
        thread.start()
        self._server, self._thread = server, thread
        self._served = True

    def _bind(self, port: int, *, reopening: bool) -> Server:
        """Reopening after an outage must get the same port back; a socket from
        the previous server may take a moment to release it. A first start on
        a port somebody else holds fails at once: waiting would not free it."""
        deadline = time.monotonic() + (5.0 if reopening else 0.0)
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
        self._faults.add("fail", count, status, method, path, retry_after, code)

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
        self._faults.add("ambiguous", count, 502, method, path, retry_after, None)

    def clear_faults(self) -> None:
        """Forget the injected faults no request has used up yet."""
        self._faults.clear()

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
            self._open(self._port, reopening=True)
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
        self._faults.set_latency(seconds)

    # -- setup -----------------------------------------------------------------------

    def add_environment(self, owner: str, name: str) -> str:
        """Publish ``owner/name`` on the hub so ``@latest`` resolves it; returns its id."""
        return self._environments.publish(owner, name)

    # -- what was received -----------------------------------------------------------

    def runs(self) -> list[FakeRun]:
        with self._store.lock:
            return copy.deepcopy(list(self._store.runs.values()))

    def run(self, run_id: str) -> FakeRun:
        with self._store.lock:
            run = self._store.runs.get(run_id)
            if run is None:
                known = ", ".join(self._store.runs) or "none"
                raise KeyError(f"no run {run_id!r} on the fake platform (runs: {known})")
            return copy.deepcopy(run)

    def episodes(self, run_id: str) -> list[JSONObject]:
        """Episode lines stored for ``run_id`` (read from ``trace.run.id``), in
        arrival order, each episode id once (a later copy replaces the record)."""
        with self._store.lock:
            return copy.deepcopy(list(self._store.episodes.get(run_id, {}).values()))

    def traces(self, run_id: str) -> list[JSONObject]:
        """Bare trace lines stored for ``run_id``, each trace id once."""
        with self._store.lock:
            return copy.deepcopy(list(self._store.traces.get(run_id, {}).values()))

    def episode_deliveries(self, run_id: str) -> dict[str, int]:
        """How many distinct committed uploads carried each episode of ``run_id``;
        more than one means the producer sent the same episode twice."""
        with self._store.lock:
            return {
                episode_id: count
                for (stored_run, episode_id), count in self._store.deliveries.items()
                if stored_run == run_id
            }

    def samples(self, run_id: str) -> list[JSONObject]:
        """Legacy v0 sample rows pushed to the evaluation, in arrival order."""
        with self._store.lock:
            return copy.deepcopy(self._store.samples.get(run_id, []))

    def training_metrics(self, run_id: str) -> list[JSONObject]:
        """One row per step (a repeated step replaces its row), in arrival order."""
        with self._store.lock:
            return copy.deepcopy(self._store.training_metrics.get(run_id, []))

    def metrics_posts(self, run_id: str) -> list[JSONObject]:
        """Every metrics row posted for ``run_id``, as posted, in arrival order."""
        with self._store.lock:
            return copy.deepcopy(self._store.metrics_posts.get(run_id, []))

    def training_samples(self, run_id: str) -> list[FakeStepSamples]:
        with self._store.lock:
            return list(self._store.step_samples.get(run_id, []))

    def environments(self) -> dict[str, str]:
        """Every environment id the hub knows, with its name."""
        with self._store.lock:
            return dict(self._store.environment_names)

    @property
    def uploads(self) -> list[FakeUpload]:
        """Committed Prime Traces uploads, in commit order."""
        with self._store.lock:
            return copy.deepcopy(list(self._store.uploads.values()))

    def requests(self) -> list[RecordedRequest]:
        with self._store.lock:
            return list(self._store.requests)

    # -- dispatch --------------------------------------------------------------------

    def _serve(self, request: Request) -> Response:
        latency = self._faults.latency
        if latency:
            time.sleep(latency)
        fault = self._faults.take(request)
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

    def _route(self, request: Request) -> tuple[Route, re.Match[str]]:
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

    def _authenticate(self, route: Route, request: Request) -> None:
        if route.service in ("storage", "dashboard"):
            return
        if request.header("Authorization") == f"Bearer {self.api_key}":
            return
        message = "missing or invalid API key"
        if route.service == "traces":
            raise coded(401, ErrorCode.UNAUTHENTICATED, message)
        raise detail(401, message)

    def _record(self, request: Request, response: Response, fault: Fault | None) -> None:
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
        with self._store.lock:
            self._store.requests.append(recorded)
        hook = self.on_request
        if hook is not None:
            hook(recorded)
