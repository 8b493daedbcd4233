"""The viewer as an ASGI app: who may read, its routes, and how every
answer (a page, a JSON status, a file of its own, or a page saying what went
wrong) goes out.

Routing is Starlette's, on the path exactly as the browser sent it
(``raw_path``, still percent-encoded): the routes match whole segments, and
each segment is decoded once, into the id it names (:func:`.html.segment`,
the inverse of the :func:`.html.url` every link is written with). An id
holding ``/``, ``%41`` or ``..`` so opens itself from its own link, never
another run or another page.

Who may read: a viewer on loopback answers requests that name it by a
loopback host only (a page elsewhere that points a browser's DNS at
127.0.0.1 gets nothing); beyond loopback every request carries the token,
in ``Authorization: Bearer``, or once in ``?token=`` (the address ``ui``
prints), which sets a cookie for the rest of the visit and redirects to the
same path of this viewer without it. Every header is built from ASCII
parts only, and every answer carries a Content-Security-Policy that allows
the viewer's own files and nothing inline. Every handler runs on a worker
thread (SQLite reads block), and whatever goes wrong answers with a page
that says what, never a traceback.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import Message, Receive, Scope, Send

from .._text import shown
from ..deliver.spool import RunRow, Spool, SpoolError
from . import pages
from .chart_data import chart_data
from .compare import compare_data
from .episodes import MORE_BUDGET, QueryError, episode_detail, episode_table, table_query
from .html import segment
from .older import OlderRunsReader
from .run_data import run_data
from .runs import STATES, STATUSES, run_view, runs_named, select_runs

__all__ = ["POLICY", "TOKEN_COOKIE", "ViewerApp"]

logger = logging.getLogger(__name__)

TOKEN_COOKIE = "prime_runs_otel_ui"
#: No inline script or style, nothing from elsewhere: the page's own files only.
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = (
    (b"content-security-policy", POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
_STATIC = {
    "viewer.css": "text/css; charset=utf-8",
    "viewer.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    # uPlot, vendored from npm with its licence (static/VENDORED.md).
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
}
_MAX_COMPARED = 6
#: Characters a path keeps as they are when written into a header: the rest
#: (controls, spaces, backslashes, anything beyond ASCII) is percent-encoded.
_PATH_SAFE = "/%-._~!$&'()*+,;=:@"


class NotFound(Exception):
    """What was asked for is not in the store (said how to find it)."""


def _page(html: str, status: int = 200) -> Response:
    return HTMLResponse(html, status, headers={"cache-control": "no-store"})


def _json(value: Any, status: int = 200) -> Response:
    return JSONResponse(value, status, headers={"cache-control": "no-store"})


def route_path(scope: Scope) -> str:
    """The path as sent, percent-encoded and ASCII (what the routes match)."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes):
        raw = scope.get("path", "/").encode("utf-8", "surrogateescape")
    return quote(raw.split(b"?", 1)[0], safe=_PATH_SAFE) or "/"


def _own_path(scope: Scope) -> str:
    """The request's path as a path of this viewer only: one leading slash,
    so that no ``//host`` or ``/\\host`` can send a browser elsewhere."""
    return "/" + route_path(scope).lstrip("/")


def _cookie_value(token: str) -> str:
    """What the cookie holds: a digest of the token, ASCII whatever it is."""
    return hashlib.sha256(
        b"prime-runs-otel-ui\0" + token.encode("utf-8", "surrogatepass")
    ).hexdigest()


class ViewerApp:
    """``spool`` read by every page; ``token`` required when set;
    ``allowed_hosts`` the ``Host`` values answered (``None``: any);
    ``since`` parses the runs filter's "since" (an age or a date) into a
    timestamp; ``reader`` reads runs stored by an earlier release meanwhile."""

    def __init__(
        self,
        spool: Spool,
        *,
        token: str | None = None,
        allowed_hosts: frozenset[str] | None = None,
        since: Callable[[str], float] | None = None,
        reader: OlderRunsReader | None = None,
    ) -> None:
        self._spool = spool
        self._token = token
        self._allowed_hosts = allowed_hosts
        self._since = since
        self._reader = reader
        self._router = Router(
            routes=[
                Route("/", self._guarded(self._runs)),
                Route("/healthz", self._guarded(lambda _: _json({"status": "ok"}))),
                Route("/static/{name}", self._guarded(self._static)),
                Route("/compare", self._guarded(self._compare)),
                Route("/runs/{run}", self._guarded(self._run_page)),
                Route("/runs/{run}/episodes", self._guarded(self._episodes)),
                Route("/runs/{run}/episodes/{episode}", self._guarded(self._episode)),
                Route("/runs/{run}/episodes/{episode}/record", self._guarded(self._record)),
                Route("/api/runs", self._guarded(self._api_runs)),
                Route("/api/runs/{run}/status", self._guarded(self._api_status)),
                Route("/api/runs/{run}/charts", self._guarded(self._charts)),
            ],
            redirect_slashes=False,
            default=self._not_found,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        routed = {**scope, "path": route_path(scope), "root_path": ""}
        await self._router(routed, receive, send_with_headers)

    # -- who may read --------------------------------------------------------------

    def _refusal(self, scope: Scope) -> Response | None:
        headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", [])
        }
        if scope["method"] not in ("GET", "HEAD"):
            answer = _page(pages.problem_page("Read-only", "The viewer only reads: use GET."), 405)
            answer.headers["allow"] = "GET, HEAD"
            return answer
        host = headers.get("host", "")
        if self._allowed_hosts is not None and host.lower() not in self._allowed_hosts:
            return _page(
                pages.problem_page(
                    "Unknown host",
                    f"This viewer answers on {', '.join(sorted(self._allowed_hosts))} only, "
                    f"not {shown(host, 80)!r}: open the address `prime-runs-otel ui` printed.",
                ),
                421,
            )
        if not self._token:
            return None
        query = _query(scope)
        given = dict(query).get("token")
        if given is not None and _same(given, self._token):
            rest = urlencode([(name, value) for name, value in query if name != "token"])
            answer = Response(status_code=303)
            answer.headers["location"] = _own_path(scope) + (f"?{rest}" if rest else "")
            answer.headers["cache-control"] = "no-store"
            answer.set_cookie(
                TOKEN_COOKIE, _cookie_value(self._token), httponly=True, samesite="strict"
            )
            return answer
        cookie = _cookie(headers.get("cookie", ""), TOKEN_COOKIE)
        if cookie is not None and hmac.compare_digest(
            cookie.encode("latin-1"), _cookie_value(self._token).encode()
        ):
            return None
        scheme, _, value = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and _same(value.strip(), self._token):
            return None
        return _page(
            pages.problem_page(
                "Token needed",
                "This viewer listens beyond this machine, so it needs its token: open the "
                "address `prime-runs-otel ui` printed (it ends in ?token=...), or send "
                "'Authorization: Bearer <token>'.",
            ),
            401,
        )

    # -- what they read ------------------------------------------------------------

    def _guarded(self, handler: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """``handler`` answering what goes wrong with a page that says what.
        Synchronous: Starlette runs it on a worker thread."""

        def guarded(request: Request) -> Response:
            try:
                return handler(request)
            except NotFound as exc:
                return _page(pages.problem_page("Not found", str(exc)), 404)
            except QueryError as exc:
                return _page(pages.problem_page("Cannot show that", str(exc)), 400)
            except SpoolError as exc:
                return _page(
                    pages.problem_page(
                        "The local store cannot be read",
                        str(exc),
                        hint="`prime-runs-otel doctor` checks the store.",
                    ),
                    503,
                )
            except Exception as exc:  # a page must never answer with a traceback
                logger.exception("The viewer failed on %s", shown(request.url.path, 200))
                return _page(
                    pages.problem_page(
                        "This page failed",
                        f"{type(exc).__name__}: {shown(exc, 300)}",
                        hint="The rest of the viewer still works; the details are in the "
                        "terminal running `prime-runs-otel ui`.",
                    ),
                    500,
                )

        return guarded

    async def _not_found(self, scope: Scope, receive: Receive, send: Send) -> None:
        page = pages.problem_page(
            "Not found", f"There is no page {shown(scope['path'], 120)!r} here."
        )
        await _page(page, 404)(scope, receive, send)

    def _params(self, request: Request) -> dict[str, str]:
        return dict(request.query_params)

    def _run_key(self, request: Request) -> RunRow:
        return self._run(segment(request.path_params["run"]))

    def _run(self, key: str) -> RunRow:
        named = runs_named(self._spool, key)
        if len(named) == 1:
            return named[0]
        if named:
            raise NotFound(f"{len(named)} runs are named {shown(key, 80)!r}: open one by its id.")
        raise NotFound(
            f"There is no run {shown(key, 80)!r} in {self._spool.path}: it may have been "
            "removed (`prime-runs-otel rm`, `prune`), or recorded into another store."
        )

    def _select(self, params: dict[str, str]) -> list[RunRow]:
        since = None
        if params.get("since"):
            if self._since is None:
                raise QueryError("This viewer takes no 'since' filter.")
            try:
                since = self._since(params["since"])
            except Exception as exc:
                raise QueryError(shown(exc, 300)) from None
        status = params.get("status") or ""
        if status and status not in (*STATUSES, *STATES):
            raise QueryError(
                f"status={shown(status, 40)!r}: one of {', '.join((*STATUSES, *STATES))}"
            )
        kind = params.get("kind") or ""
        if kind and kind not in ("eval", "train"):
            raise QueryError(f"kind={shown(kind, 40)!r}: eval or train")
        return select_runs(
            self._spool,
            statuses=[status] if status else (),
            kind=kind or None,
            name=params.get("name") or None,
            since=since,
        )

    def _runs(self, request: Request) -> Response:
        params = self._params(request)
        sort = params.get("sort") or "start"
        if sort not in pages.RUN_SORTS:
            raise QueryError(f"sort={shown(sort, 40)!r}: one of {', '.join(pages.RUN_SORTS)}")
        order = params.get("order") or pages.RUN_SORTS[sort][1]
        if order not in ("asc", "desc"):
            raise QueryError(f"order={shown(order, 40)!r}: asc or desc")
        views = [run_view(self._spool, row) for row in self._select(params)]
        views = pages.sort_runs(views, sort, order)
        filters = {key: value for key, value in params.items() if value}
        reading = self._reader.reading if self._reader is not None else None
        empty = not views and not self._spool.reading.runs()
        return _page(
            pages.runs_page(
                views,
                filters,
                reading=reading,
                spool=str(self._spool.path),
                empty_store=empty,
                sort=sort,
                order=order,
            )
        )

    def _run_page(self, request: Request) -> Response:
        run = self._run_key(request)
        part = request.query_params.get("part")
        if part not in (None, "", "live"):
            raise QueryError(f"part={shown(part, 40)!r}: only part=live")
        data = run_data(self._spool, run, with_series=False)
        return _page(pages.run_page(data, live_part=part == "live"))

    def _charts(self, request: Request) -> Response:
        return _json(chart_data(self._spool, self._run_key(request)))

    def _episodes(self, request: Request) -> Response:
        run = self._run_key(request)
        params = self._params(request)
        table = episode_table(self._spool, run, table_query(params))
        return _page(pages.episodes_page(run, table, params, clamped=table.clamped))

    def _episode_of(self, request: Request, *, budget: int | None = None) -> Any:
        run = self._run_key(request)
        episode_id = segment(request.path_params["episode"])
        kwargs = {} if budget is None else {"budget": budget}
        detail = episode_detail(self._spool, run, episode_id, **kwargs)
        if detail is None:
            raise NotFound(
                f"Run {shown(run.local_id[:12], 20)} has no episode {shown(episode_id, 80)!r}: "
                "the episode table lists the ones it has."
            )
        return run, detail

    def _episode(self, request: Request) -> Response:
        more = request.query_params.get("more")
        if more not in (None, "", "1"):
            raise QueryError(f"more={shown(more, 40)!r}: only more=1")
        run, detail = self._episode_of(request, budget=MORE_BUDGET if more else None)
        return _page(pages.episode_page(run, detail, more=bool(more)))

    def _record(self, request: Request) -> Response:
        run = self._run_key(request)
        episode_id = segment(request.path_params["episode"])
        found = self._spool.reading.episode(run.local_id, episode_id)
        if found is None or found[1] is None:
            raise NotFound(
                f"Run {shown(run.local_id[:12], 20)} keeps no record of episode "
                f"{shown(episode_id, 80)!r} here."
            )
        return Response(
            found[1],
            media_type="application/json",
            headers={
                "content-disposition": 'attachment; filename="episode.json"',
                "cache-control": "no-store",
            },
        )

    def _api_runs(self, request: Request) -> Response:
        return _json([self._status(row) for row in self._select(self._params(request))])

    def _api_status(self, request: Request) -> Response:
        return _json(self._status(self._run_key(request)))

    def _compare(self, request: Request) -> Response:
        keys = [value for name, value in request.query_params.multi_items() if name == "run"]
        keys = [key for key in keys if key]
        if len(keys) < 2:
            raise QueryError(
                "Compare needs two runs or more: tick them on the runs page, or open "
                "/compare?run=ID&run=ID."
            )
        if len(keys) > _MAX_COMPARED:
            raise QueryError(f"Compare shows {_MAX_COMPARED} runs at most.")
        runs = [self._run(key) for key in keys]
        return _page(pages.compare_page(compare_data(self._spool, runs)))

    def _status(self, run: RunRow) -> dict[str, Any]:
        view = run_view(self._spool, run)
        summary = view["summary"]
        return {
            "id": view["id"],
            "status": view["status"],
            "state": view["state"],
            "episodes": view["episodes"],
            "pending": view["pending"],
            "not_pushed": view["not_pushed"],
            "failed": view["failed"],
            "avg_reward": summary.get("avg_reward"),
            "avg_error": summary.get("avg_error"),
            "unread": self._spool.reading.unread_count(run.local_id),
        }

    def _static(self, request: Request) -> Response:
        name = segment(request.path_params["name"])
        if name not in _STATIC:
            raise NotFound(f"There is no file {shown(name, 80)!r} here.")
        data = resources.files(__package__).joinpath("static").joinpath(name).read_bytes()
        return Response(
            data, headers={"cache-control": "max-age=300", "content-type": _STATIC[name]}
        )


def _same(given: str | None, token: str) -> bool:
    if not given:
        return False
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass")
    )


def _query(scope: Scope) -> list[tuple[str, str]]:
    return parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)


def _cookie(header: str, name: str) -> str | None:
    for piece in header.split(";"):
        key, _, value = piece.strip().partition("=")
        if key == name:
            return value
    return None
