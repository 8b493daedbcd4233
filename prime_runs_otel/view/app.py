"""The viewer as a small ASGI app: its routes, who may read them, and how
every answer (a page, a JSON status, a file of its own, or a page saying
what went wrong) goes out.

No web framework: a handful of GET routes over a read-only store need a
path match, a query string and a few headers, which the standard library
and uvicorn's ASGI give as they are (the same as ``serve``'s HTTP front).

Who may read: a viewer on loopback answers requests that name it by a
loopback host only (a page elsewhere that points a browser's DNS at
127.0.0.1 gets nothing); beyond loopback every request carries the token,
in ``Authorization: Bearer``, or once in ``?token=`` (the address ``ui``
prints), which sets a cookie for the rest of the visit. Every handler runs
on a worker thread (SQLite reads block), and whatever goes wrong answers
with a page that says what, never a traceback.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

from .._text import shown
from ..deliver.spool import RunRow, Spool, SpoolError
from . import pages
from .compare import compare_data
from .episodes import QueryError, episode_detail, episode_table, table_query
from .html import Html
from .older import OlderRunsReader
from .run_data import run_data
from .runs import run_view, runs_named, select_runs

__all__ = ["TOKEN_COOKIE", "ViewerApp"]

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TOKEN_COOKIE = "prime_runs_otel_ui"
_HTML = "text/html; charset=utf-8"
_JSON = "application/json"
#: No inline script or style, nothing from elsewhere: the page's own files only.
_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_STATIC = {"viewer.css": "text/css; charset=utf-8", "viewer.js": "text/javascript; charset=utf-8"}
_MAX_COMPARED = 6


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str = _HTML
    headers: list[tuple[str, str]] = field(default_factory=list)


class NotFound(Exception):
    """What was asked for is not in the store (said how to find it)."""


def _page(html: Html, status: int = 200) -> Answer:
    return Answer(status, html.encode("utf-8"))


def _json(value: Any, status: int = 200) -> Answer:
    return Answer(status, json.dumps(value, allow_nan=False, default=str).encode(), _JSON)


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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        answer = self._refusal(scope)
        if answer is None:
            answer = await asyncio.to_thread(self._answer, scope)
        await _send(send, answer, head=scope["method"] == "HEAD")

    # -- who may read --------------------------------------------------------------

    def _refusal(self, scope: Scope) -> Answer | None:
        headers = _headers(scope)
        if scope["method"] not in ("GET", "HEAD"):
            answer = _page(pages.problem_page("Read-only", "The viewer only reads: use GET."), 405)
            answer.headers.append(("allow", "GET, HEAD"))
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
        params = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        given = params.get("token")
        if given is not None and _same(given, self._token):
            rest = urlencode([(k, v) for k, v in _query(scope) if k != "token"])
            answer = Answer(303, b"")
            answer.headers += [
                ("location", scope["path"] + (f"?{rest}" if rest else "")),
                ("set-cookie", f"{TOKEN_COOKIE}={self._token}; HttpOnly; SameSite=Strict; Path=/"),
            ]
            return answer
        if _same(_cookie(headers.get("cookie", ""), TOKEN_COOKIE), self._token):
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

    def _answer(self, scope: Scope) -> Answer:
        path = scope["path"]
        try:
            return self._route(path, _query(scope))
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
            logger.exception("The viewer failed on %s", shown(path, 200))
            return _page(
                pages.problem_page(
                    "This page failed",
                    f"{type(exc).__name__}: {shown(exc, 300)}",
                    hint="The rest of the viewer still works; the details are in the terminal "
                    "running `prime-runs-otel ui`.",
                ),
                500,
            )

    def _route(self, path: str, query: list[tuple[str, str]]) -> Answer:
        parts = [unquote(part) for part in path.strip("/").split("/")] if path != "/" else []
        params = dict(query)
        if not parts:
            return self._runs(params)
        head, rest = parts[0], parts[1:]
        if head == "static" and len(rest) == 1 and rest[0] in _STATIC:
            return self._static(rest[0])
        if head == "healthz" and not rest:
            return _json({"status": "ok"})
        if head == "compare" and not rest:
            return self._compare([value for name, value in query if name == "run" and value])
        if head == "runs" and len(rest) == 1:
            run = self._run(rest[0])
            part = params.get("part") == "live"
            return _page(pages.run_page(run_data(self._spool, run), live_part=part))
        if head == "runs" and len(rest) == 2 and rest[1] == "episodes":
            run = self._run(rest[0])
            table = episode_table(self._spool, run, table_query(params))
            return _page(pages.episodes_page(run, table, params))
        if head == "runs" and len(rest) == 3 and rest[1] == "episodes":
            run = self._run(rest[0])
            detail = episode_detail(self._spool, run, rest[2])
            if detail is None:
                raise NotFound(
                    f"Run {run.local_id[:12]} has no episode {shown(rest[2], 80)!r}: "
                    "the episode table lists the ones it has."
                )
            return _page(pages.episode_page(run, detail))
        if head == "api" and rest == ["runs"]:
            return _json([self._status(row) for row in self._select(params)])
        if head == "api" and len(rest) == 3 and rest[0] == "runs" and rest[2] == "status":
            return _json(self._status(self._run(rest[1])))
        raise NotFound(f"There is no page {shown(path, 120)!r} here.")

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
                raise QueryError(str(exc)) from None
        return select_runs(
            self._spool,
            statuses=[params["status"]] if params.get("status") else (),
            kind=params.get("kind") or None,
            name=params.get("name") or None,
            since=since,
        )

    def _runs(self, params: dict[str, str]) -> Answer:
        views = [run_view(self._spool, row) for row in self._select(params)]
        filters = {key: value for key, value in params.items() if value}
        reading = self._reader.reading if self._reader is not None else None
        return _page(pages.runs_page(views, filters, reading=reading))

    def _compare(self, keys: list[str]) -> Answer:
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
            "pending": view["pending"] or view["not_pushed"],
            "failed": view["failed"],
            "avg_reward": summary.get("avg_reward"),
            "avg_error": summary.get("avg_error"),
            "unread": self._spool.unread_count(run.local_id),
        }

    def _static(self, name: str) -> Answer:
        data = resources.files(__package__).joinpath("static").joinpath(name).read_bytes()
        answer = Answer(200, data, _STATIC[name])
        answer.headers.append(("cache-control", "max-age=300"))
        return answer


def _same(given: str | None, token: str) -> bool:
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8"))


def _headers(scope: Scope) -> dict[str, str]:
    return {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in scope.get("headers", [])
    }


def _query(scope: Scope) -> list[tuple[str, str]]:
    return parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)


def _cookie(header: str, name: str) -> str | None:
    for piece in header.split(";"):
        key, _, value = piece.strip().partition("=")
        if key == name:
            return value
    return None


async def _send(send: Send, answer: Answer, *, head: bool) -> None:
    headers = [
        (b"content-type", answer.content_type.encode()),
        (b"content-length", str(len(answer.body)).encode()),
        (b"content-security-policy", _POLICY.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"cache-control", b"no-store"),
    ]
    names = {name for name, _ in answer.headers}
    if "cache-control" in names:
        headers = [(name, value) for name, value in headers if name != b"cache-control"]
    headers += [(name.encode(), value.encode("latin-1")) for name, value in answer.headers]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else answer.body})
